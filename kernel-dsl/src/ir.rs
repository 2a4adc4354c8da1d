//! The kernel IR: typed expressions and statements, and the kernel template they make up.
//!
//! A template is what `#[kernel]` produces from a Rust function: its tile parameters are still
//! symbols (`ExprKind::Tile`). [`crate::specialize`] turns a template plus tile values and an
//! architecture into a [`crate::Kernel`], which [`crate::emit`] prints as CUDA C.

use crate::intrinsic::Intrinsic;
use crate::types::{Elem, Scalar, Space, Type};

/// A typed expression.
#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub ty: Type,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    Lit(Lit),
    /// A parameter or a local variable.
    Var(String),
    /// A tile parameter, replaced by its value when the template is specialised.
    Tile(String),
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// A value conversion to `Expr::ty` (Rust's `as`).
    Cast(Box<Expr>),
    /// `base[index]`: a load from a pointer or an array.
    Index(Box<Expr>, Box<Expr>),
    /// A lane of a vector value (`v.x`).
    Lane(Box<Expr>, u8),
    Call(Intrinsic, Vec<Expr>),
    /// `if c { a } else { b }` used as a value.
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
    /// The escape hatch: CUDA text with `{0}`, `{1}`, … standing for the arguments.
    Raw(String, Vec<Expr>),
}

/// A literal value; its type is the enclosing [`Expr`]'s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Lit {
    Int(i128),
    Float(f64),
    Bool(bool),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    Neg,
    /// Logical not on bool, bitwise not on integers (Rust's `!`).
    Not,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    BitAnd,
    BitOr,
    BitXor,
    Shl,
    Shr,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

impl BinOp {
    /// The operator as written in both Rust and C.
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
            BinOp::BitAnd => "&",
            BinOp::BitOr => "|",
            BinOp::BitXor => "^",
            BinOp::Shl => "<<",
            BinOp::Shr => ">>",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::And => "&&",
            BinOp::Or => "||",
        }
    }

    pub fn is_comparison(self) -> bool {
        matches!(self, BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge)
    }

    pub fn is_logical(self) -> bool {
        matches!(self, BinOp::And | BinOp::Or)
    }

    pub fn is_bitwise(self) -> bool {
        matches!(self, BinOp::BitAnd | BinOp::BitOr | BinOp::BitXor | BinOp::Shl | BinOp::Shr)
    }

    pub fn is_shift(self) -> bool {
        matches!(self, BinOp::Shl | BinOp::Shr)
    }
}

/// A statement.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `let [mut] name: ty = init;` for a scalar or vector value.
    Let {
        name: String,
        ty: Type,
        mutable: bool,
        init: Expr,
    },
    /// A local (`[fill; len]`) or shared (`shared::<T, LEN>()`) array.
    Array {
        name: String,
        elem: Elem,
        len: Expr,
        space: Space,
        fill: Option<Expr>,
    },
    /// `place = value` or `place op= value`. The place is a variable, an index into a pointer or
    /// array, or a lane of a vector variable.
    Assign {
        place: Expr,
        op: Option<BinOp>,
        value: Expr,
    },
    If {
        cond: Expr,
        then: Vec<Stmt>,
        els: Vec<Stmt>,
    },
    /// `for var in start..end` (or `(start..end).step_by(step)`), the end excluded.
    For {
        var: String,
        ty: Scalar,
        start: Expr,
        end: Expr,
        step: Expr,
        unroll: Unroll,
        body: Vec<Stmt>,
    },
    While {
        cond: Expr,
        body: Vec<Stmt>,
    },
    Break,
    Continue,
    Return,
    /// A call made for its effect (`sync_threads();`).
    Expr(Expr),
}

/// The unroll hint of a loop: `#[unroll]`, `#[unroll(4)]` or `#[unroll(TILE)]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Unroll {
    None,
    Full,
    By(u32),
    /// By a u32 tile parameter; becomes `By` when the template is specialised.
    ByTile(String),
}

/// A kernel parameter: a global pointer or a scalar passed by value.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: String,
    pub ty: Type,
}

/// The type of a tile parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileType {
    U32,
    Bool,
}

impl TileType {
    pub fn as_type(self) -> Type {
        match self {
            TileType::U32 => Type::Scalar(Scalar::U32),
            TileType::Bool => Type::Scalar(Scalar::Bool),
        }
    }
}

/// A compile-time parameter of a template (a tile shape, a vector width, a switch).
#[derive(Clone, Debug, PartialEq)]
pub struct TileParam {
    pub name: String,
    pub ty: TileType,
}

/// A kernel as written, with its tile parameters still symbolic.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTemplate {
    /// The kernel's name; also its entry symbol in the emitted CUDA.
    pub name: String,
    /// The Rust file that defines it, as `file!()` gives it.
    pub origin: String,
    /// The doc comment of the Rust function, line by line.
    pub doc: Vec<String>,
    pub tiles: Vec<TileParam>,
    pub params: Vec<Param>,
    pub body: Vec<Stmt>,
    /// `#[kernel(..., cooperative)]`: the blocks wait for each other (software grid barriers), so
    /// every launch is a cooperative one ([`crate::LaunchDims::cooperative`]).
    pub cooperative: bool,
}

impl Expr {
    pub fn new(kind: ExprKind, ty: Type) -> Expr {
        Expr { kind, ty }
    }

    pub fn int(value: i128, ty: Scalar) -> Expr {
        Expr::new(ExprKind::Lit(Lit::Int(value)), Type::Scalar(ty))
    }

    pub fn u32(value: u32) -> Expr {
        Expr::int(i128::from(value), Scalar::U32)
    }

    pub fn f32(value: f32) -> Expr {
        Expr::new(ExprKind::Lit(Lit::Float(f64::from(value))), Type::F32)
    }

    pub fn bool(value: bool) -> Expr {
        Expr::new(ExprKind::Lit(Lit::Bool(value)), Type::BOOL)
    }

    pub fn var(name: &str, ty: Type) -> Expr {
        Expr::new(ExprKind::Var(name.to_owned()), ty)
    }

    pub fn binary(op: BinOp, lhs: Expr, rhs: Expr, ty: Type) -> Expr {
        Expr::new(ExprKind::Binary(op, Box::new(lhs), Box::new(rhs)), ty)
    }

    pub fn index(base: Expr, index: Expr) -> Expr {
        let ty = base.ty.indexed().map_or(Type::Void, Elem::as_type);
        Expr::new(ExprKind::Index(Box::new(base), Box::new(index)), ty)
    }

    pub fn call(f: Intrinsic, args: Vec<Expr>, ty: Type) -> Expr {
        Expr::new(ExprKind::Call(f, args), ty)
    }

    pub fn cast(arg: Expr, to: Scalar) -> Expr {
        Expr::new(ExprKind::Cast(Box::new(arg)), Type::Scalar(to))
    }

    /// The literal this expression is, if it is one.
    pub fn as_lit(&self) -> Option<Lit> {
        match self.kind {
            ExprKind::Lit(l) => Some(l),
            _ => None,
        }
    }

    pub fn as_u32(&self) -> Option<u32> {
        match self.kind {
            ExprKind::Lit(Lit::Int(v)) => u32::try_from(v).ok(),
            _ => None,
        }
    }

    /// Calls `f` on this expression and every sub-expression, parents first.
    pub fn visit(&self, f: &mut impl FnMut(&Expr)) {
        f(self);
        match &self.kind {
            ExprKind::Lit(_) | ExprKind::Var(_) | ExprKind::Tile(_) => {}
            ExprKind::Unary(_, a) | ExprKind::Cast(a) | ExprKind::Lane(a, _) => a.visit(f),
            ExprKind::Binary(_, a, b) | ExprKind::Index(a, b) => {
                a.visit(f);
                b.visit(f);
            }
            ExprKind::Select(c, a, b) => {
                c.visit(f);
                a.visit(f);
                b.visit(f);
            }
            ExprKind::Call(_, args) | ExprKind::Raw(_, args) => args.iter().for_each(|a| a.visit(f)),
        }
    }
}

impl Stmt {
    /// Calls `f` on every expression of this statement and of the statements nested in it.
    pub fn visit_exprs(&self, f: &mut impl FnMut(&Expr)) {
        match self {
            Stmt::Let { init, .. } => init.visit(f),
            Stmt::Array { len, fill, .. } => {
                len.visit(f);
                if let Some(fill) = fill {
                    fill.visit(f);
                }
            }
            Stmt::Assign { place, value, .. } => {
                place.visit(f);
                value.visit(f);
            }
            Stmt::If { cond, then, els } => {
                cond.visit(f);
                then.iter().chain(els).for_each(|s| s.visit_exprs(f));
            }
            Stmt::For { start, end, step, body, .. } => {
                start.visit(f);
                end.visit(f);
                step.visit(f);
                body.iter().for_each(|s| s.visit_exprs(f));
            }
            Stmt::While { cond, body } => {
                cond.visit(f);
                body.iter().for_each(|s| s.visit_exprs(f));
            }
            Stmt::Expr(e) => e.visit(f),
            Stmt::Break | Stmt::Continue | Stmt::Return => {}
        }
    }

    /// Calls `f` on this statement and every statement nested in it, parents first.
    pub fn visit(&self, f: &mut impl FnMut(&Stmt)) {
        f(self);
        match self {
            Stmt::If { then, els, .. } => then.iter().chain(els).for_each(|s| s.visit(f)),
            Stmt::For { body, .. } | Stmt::While { body, .. } => body.iter().for_each(|s| s.visit(f)),
            _ => {}
        }
    }
}
