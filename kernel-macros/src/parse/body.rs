//! Lowers a kernel body to `kernel-dsl` IR while type-checking it, so that every mistake is an
//! error at its own span when the crate compiles.
//!
//! Locals keep their Rust names; a `let` that shadows an earlier name gets a numbered one
//! (`acc_1`), so that every C name in a kernel is unique and branches can be spliced by the folder.
//! A call of a device function from the kernel's helpers file is expanded in place
//! ([`Lower::inline`]); its locals are numbered the same way.

use std::collections::{HashMap, HashSet};

use kernel_dsl::intrinsic::Intrinsic;
use kernel_dsl::ir::{BinOp, Expr, ExprKind, Lit, Stmt, TileType, UnOp, Unroll};
use kernel_dsl::types::{Elem, Scalar, Space, Type, Vector};
use kernel_dsl::typing;
use quote::ToTokens;

use super::helpers::{Helper, Helpers, Pass};
use super::kernel::{ParamDecl, elem};
use super::tiles::TileDecl;

/// A lowered body, with the C names chosen for the parameters (in their order).
pub(crate) struct Lowered {
    pub(crate) body: Vec<Stmt>,
    pub(crate) param_names: Vec<String>,
}

/// Lowers the body of a kernel.
pub(crate) fn lower(
    block: &syn::Block,
    tiles: &[TileDecl],
    params: &[ParamDecl],
    helpers: &Helpers,
) -> syn::Result<Lowered> {
    let mut cx = Lower {
        scopes: vec![HashMap::new()],
        used: HashSet::new(),
        loops: 0,
        helpers,
        expanding: Vec::new(),
        stand_ins: 0,
        constants: Vec::new(),
    };
    for t in tiles {
        let name = t.name.to_string();
        let ty = match t.ty {
            TileType::U32 => Type::U32,
            TileType::Bool => Type::BOOL,
        };
        cx.bind(&name, Binding { c_name: name.clone(), ty, kind: Kind::Tile });
    }
    let mut param_names = Vec::new();
    for p in params {
        let name = p.name.to_string();
        let c_name = cx.fresh(&name);
        param_names.push(c_name.clone());
        cx.bind(&name, Binding { c_name, ty: p.ty, kind: Kind::Param });
    }
    Ok(Lowered { body: cx.block_stmts(&block.stmts)?, param_names })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tile,
    Param,
    Local {
        mutable: bool,
    },
    LoopVar,
    /// A `const` of the body: its value (tiles and literals) is `Lower::constants[i]`, put in
    /// place of each use, so that it may size an array as the expression written out would.
    Const(usize),
}

#[derive(Clone)]
struct Binding {
    c_name: String,
    ty: Type,
    kind: Kind,
}

struct Lower<'h> {
    scopes: Vec<HashMap<String, Binding>>,
    used: HashSet<String>,
    loops: usize,
    /// The device functions the body may call.
    helpers: &'h Helpers,
    /// The helpers being expanded, innermost last (a helper may call another, not itself).
    expanding: Vec<String>,
    /// Stand-ins made for the arguments of helpers inside expressions, for unique names.
    stand_ins: usize,
    /// The values of the body's `const` items, by `Kind::Const` index.
    constants: Vec<Expr>,
}

fn err<T>(tokens: impl ToTokens, msg: impl std::fmt::Display) -> syn::Result<T> {
    Err(syn::Error::new_spanned(tokens, msg))
}

impl<'h> Lower<'h> {
    fn bind(&mut self, rust_name: &str, b: Binding) {
        self.used.insert(b.c_name.clone());
        if let Some(scope) = self.scopes.last_mut() {
            scope.insert(rust_name.to_owned(), b);
        }
    }

    /// A C name for a new variable: the Rust name, numbered if the kernel already uses it, with a
    /// trailing underscore if C or CUDA reserves it (`float` → `float_`).
    fn fresh(&self, rust_name: &str) -> String {
        let base = if rust_name.starts_with("__") {
            format!("v{rust_name}")
        } else if kernel_dsl::emit::is_reserved(rust_name) {
            format!("{rust_name}_")
        } else {
            rust_name.to_owned()
        };
        if !self.used.contains(&base) {
            return base;
        }
        (1..).map(|i| format!("{base}_{i}")).find(|n| !self.used.contains(n)).unwrap_or_default()
    }

    fn lookup(&self, name: &str) -> Option<&Binding> {
        self.scopes.iter().rev().find_map(|s| s.get(name))
    }

    fn scoped<T>(&mut self, f: impl FnOnce(&mut Self) -> syn::Result<T>) -> syn::Result<T> {
        self.scopes.push(HashMap::new());
        let r = f(self);
        self.scopes.pop();
        r
    }

    fn block_stmts(&mut self, stmts: &[syn::Stmt]) -> syn::Result<Vec<Stmt>> {
        let mut out = Vec::new();
        for s in stmts {
            self.stmt(s, &mut out)?;
        }
        Ok(out)
    }

    fn block(&mut self, b: &syn::Block) -> syn::Result<Vec<Stmt>> {
        self.scoped(|cx| cx.block_stmts(&b.stmts))
    }

    // ---- statements ----

    fn stmt(&mut self, s: &syn::Stmt, out: &mut Vec<Stmt>) -> syn::Result<()> {
        match s {
            syn::Stmt::Local(l) => self.local(l, out),
            syn::Stmt::Expr(e, semi) => {
                if semi.is_none() && !is_block_like(e) {
                    return err(e, "a kernel returns nothing: end this expression with `;`");
                }
                self.expr_stmt(e, out)
            }
            syn::Stmt::Item(syn::Item::Const(c)) => self.constant(c),
            syn::Stmt::Item(i) => err(i, "items (fn, struct, use) are not allowed in a kernel body; `const` is"),
            syn::Stmt::Macro(m) => {
                err(m, "macros are not available in a kernel body; `raw_cuda::<T>(..)` is the escape hatch")
            }
        }
    }

    fn local(&mut self, l: &syn::Local, out: &mut Vec<Stmt>) -> syn::Result<()> {
        if let Some(a) = l.attrs.first() {
            return err(a, "the only attribute in a kernel body is #[unroll] on a `for` loop");
        }
        // `let (a, b) = (x, y);` is two lets.
        if let (syn::Pat::Tuple(pats), Some(init)) = (&l.pat, &l.init) {
            let syn::Expr::Tuple(values) = strip_parens(&init.expr) else {
                return err(&init.expr, "a tuple pattern takes a tuple of values: `let (a, b) = (x, y);`");
            };
            if pats.elems.len() != values.elems.len() {
                return err(l, "the pattern and the tuple have different lengths");
            }
            // Every value is computed before any name is bound, so `let (a, b) = (b, a);` swaps.
            let mut bindings = Vec::new();
            for (p, v) in pats.elems.iter().zip(&values.elems) {
                let syn::Pat::Ident(pi) = p else {
                    return err(p, "each name of a tuple `let` is a plain name");
                };
                if pi.by_ref.is_some() || pi.subpat.is_some() {
                    return err(pi, "each name of a tuple `let` is a plain name");
                }
                let mut value = self.expr(v)?;
                settle_default(&mut value, v)?;
                if !matches!(value.ty, Type::Scalar(_) | Type::Vector(_)) {
                    return err(v, format!("a tuple `let` binds scalars and vectors, not {}", value.ty));
                }
                bindings.push((pi, value));
            }
            for (pi, value) in bindings {
                let rust_name = pi.ident.to_string();
                let c_name = self.fresh(&rust_name);
                let (ty, mutable) = (value.ty, pi.mutability.is_some());
                out.push(Stmt::Let { name: c_name.clone(), ty, mutable, init: value });
                self.bind(&rust_name, Binding { c_name, ty, kind: Kind::Local { mutable } });
            }
            return Ok(());
        }
        let (pat, annotation) = match &l.pat {
            syn::Pat::Type(pt) => (&*pt.pat, Some(&*pt.ty)),
            p => (p, None),
        };
        let syn::Pat::Ident(pi) = pat else {
            return err(pat, "a `let` in a kernel binds one plain name");
        };
        if pi.by_ref.is_some() || pi.subpat.is_some() {
            return err(pi, "a `let` in a kernel binds one plain name");
        }
        let mutable = pi.mutability.is_some();
        let rust_name = pi.ident.to_string();
        let Some(init) = &l.init else {
            return err(l, "a `let` in a kernel needs a value: `let x: u32 = 0;`");
        };
        if let Some((_, d)) = &init.diverge {
            return err(d, "`let ... else` is not available in a kernel");
        }
        // A helper's value: its body first, then the name (so that the body's locals are named
        // before this one is). A helper call is neither `shared::<T, N>()` nor `[fill; N]`.
        let inlined = match self.helper_call(&init.expr) {
            Some((h, c)) => match self.inline(h, c, out)? {
                Some(v) => Some(v),
                None => return err(&init.expr, format!("helper `{}` returns nothing", h.name)),
            },
            None => None,
        };
        let c_name = self.fresh(&rust_name);

        // shared::<T, N>(): a shared-memory array.
        if let Some((elem_ty, len)) = shared_call(&init.expr)? {
            if let Some(a) = annotation {
                return err(a, "the type of a shared array comes from `shared::<T, N>()`");
            }
            let len = self.length(&len)?;
            out.push(Stmt::Array { name: c_name.clone(), elem: elem_ty, len, space: Space::Shared, fill: None });
            let ty = Type::Array { elem: elem_ty, space: Space::Shared };
            self.bind(&rust_name, Binding { c_name, ty, kind: Kind::Local { mutable: true } });
            return Ok(());
        }

        // [fill; N]: a local array in registers.
        if let syn::Expr::Repeat(r) = &*init.expr {
            let mut fill = self.expr(&r.expr)?;
            let elem_ty = match annotation {
                Some(syn::Type::Array(a)) => elem(&a.elem)?,
                Some(other) => return err(other, "the annotation of an array is `[T; N]`"),
                None => match fill.ty.settled() {
                    Type::Scalar(s) => Elem::Scalar(s),
                    Type::Vector(v) => Elem::Vector(v),
                    t => return err(&r.expr, format!("an array cannot hold {t}")),
                },
            };
            coerce(&mut fill, elem_ty.as_type(), &r.expr)?;
            let len = self.length(&r.len)?;
            out.push(Stmt::Array { name: c_name.clone(), elem: elem_ty, len, space: Space::Local, fill: Some(fill) });
            let ty = Type::Array { elem: elem_ty, space: Space::Local };
            self.bind(&rust_name, Binding { c_name, ty, kind: Kind::Local { mutable } });
            return Ok(());
        }

        let mut value = match inlined {
            Some(v) => v,
            None => self.expr(&init.expr)?,
        };
        let ty = match annotation {
            Some(a) => {
                let t = elem(a)?.as_type();
                coerce(&mut value, t, &init.expr)?;
                t
            }
            None => {
                settle_default(&mut value, &init.expr)?;
                value.ty
            }
        };
        match ty {
            Type::Scalar(_) | Type::Vector(_) => {}
            Type::Void => return err(&init.expr, "this call returns nothing"),
            Type::Ptr { .. } | Type::Array { .. } => {
                return err(&init.expr, "buffers and arrays cannot be copied into a local; index them where they are");
            }
            Type::IntLit | Type::FloatLit => return err(&init.expr, "cannot infer the type of this value"),
        }
        out.push(Stmt::Let { name: c_name.clone(), ty, mutable, init: value });
        self.bind(&rust_name, Binding { c_name, ty, kind: Kind::Local { mutable } });
        Ok(())
    }

    /// `const NAME: T = value;`: a scalar of tiles and literals, named once for the places that
    /// would repeat it (an array's length and the loop over it). Nothing is emitted for it.
    fn constant(&mut self, c: &syn::ItemConst) -> syn::Result<()> {
        if let Some(a) = c.attrs.iter().find(|a| !a.path().is_ident("doc")) {
            return err(a, "a `const` in a kernel body takes no attributes (a doc comment is fine)");
        }
        if !matches!(c.vis, syn::Visibility::Inherited) || !c.generics.params.is_empty() {
            return err(c, "a `const` in a kernel body is `const NAME: T = value;`");
        }
        let ty = elem(&c.ty)?.as_type();
        if !matches!(ty, Type::Scalar(_)) {
            return err(&c.ty, format!("a `const` in a kernel body is a scalar, not {ty}"));
        }
        let mut value = self.expr(&c.expr)?;
        coerce(&mut value, ty, &c.expr)?;
        let mut other = None;
        value.visit(&mut |x| match &x.kind {
            ExprKind::Lit(_)
            | ExprKind::Tile(_)
            | ExprKind::Unary(..)
            | ExprKind::Binary(..)
            | ExprKind::Cast(_)
            | ExprKind::Select(..) => {}
            ExprKind::Var(n) => {
                other.get_or_insert_with(|| format!("`{n}` is a variable"));
            }
            _ => {
                other.get_or_insert_with(|| "it holds a load or a call".to_owned());
            }
        });
        if let Some(why) = other {
            return err(&c.expr, format!("a `const` is made of literals and tiles; {why}"));
        }
        self.constants.push(value);
        let index = self.constants.len() - 1;
        self.bind(&c.ident.to_string(), Binding { c_name: String::new(), ty, kind: Kind::Const(index) });
        Ok(())
    }

    /// An array length: a u32 expression of tiles and literals (checked constant when specialised).
    fn length(&mut self, e: &syn::Expr) -> syn::Result<Expr> {
        let mut len = self.expr(e)?;
        coerce(&mut len, Type::U32, e)?;
        let mut variable = None;
        len.visit(&mut |x| {
            if let ExprKind::Var(n) = &x.kind {
                variable.get_or_insert_with(|| n.clone());
            }
        });
        if let Some(n) = variable {
            return err(e, format!("an array length is a constant of literals and tiles; `{n}` is a variable"));
        }
        Ok(len)
    }

    fn expr_stmt(&mut self, e: &syn::Expr, out: &mut Vec<Stmt>) -> syn::Result<()> {
        if !matches!(e, syn::Expr::ForLoop(_))
            && let Some(a) = expr_attrs(e).first()
        {
            return err(a, "the only attribute in a kernel body is #[unroll] on a `for` loop");
        }
        match e {
            syn::Expr::If(i) => {
                let s = self.if_stmt(i)?;
                out.push(s);
            }
            syn::Expr::ForLoop(f) => {
                let s = self.for_loop(f)?;
                out.push(s);
            }
            syn::Expr::While(w) => {
                if let Some(l) = &w.label {
                    return err(l, "loop labels are not available in a kernel");
                }
                let mut cond = self.expr(&w.cond)?;
                coerce(&mut cond, Type::BOOL, &w.cond)?;
                self.loops += 1;
                let body = self.block(&w.body);
                self.loops -= 1;
                out.push(Stmt::While { cond, body: body? });
            }
            syn::Expr::Loop(l) => {
                if let Some(l) = &l.label {
                    return err(l, "loop labels are not available in a kernel");
                }
                self.loops += 1;
                let body = self.block(&l.body);
                self.loops -= 1;
                out.push(Stmt::While { cond: Expr::bool(true), body: body? });
            }
            syn::Expr::Block(b) => {
                if b.label.is_some() {
                    return err(b, "block labels are not available in a kernel");
                }
                out.extend(self.block(&b.block)?);
            }
            syn::Expr::Assign(a) => {
                let place = self.place(&a.left)?;
                let mut value = self.expr(&a.right)?;
                coerce(&mut value, place.ty, &a.right)?;
                out.push(Stmt::Assign { place, op: None, value });
            }
            syn::Expr::Binary(b) if compound_op(&b.op).is_some() => {
                let op = compound_op(&b.op).unwrap_or(BinOp::Add);
                let place = self.place(&b.left)?;
                let mut value = self.expr(&b.right)?;
                let (operand, result) = typing::binary(op, place.ty, value.ty).or_else(|m| err(b, m))?;
                if result != place.ty || (!op.is_shift() && operand != place.ty) {
                    return err(b, format!("`{}=` on {} with {}", op.symbol(), place.ty, value.ty));
                }
                let rhs_ty = if op.is_shift() { value.ty.settled() } else { operand };
                coerce(&mut value, rhs_ty, &b.right)?;
                out.push(Stmt::Assign { place, op: Some(op), value });
            }
            syn::Expr::Break(b) => {
                if b.label.is_some() || b.expr.is_some() {
                    return err(b, "`break` takes no label or value in a kernel");
                }
                if self.loops == 0 {
                    return err(b, "`break` outside a loop");
                }
                out.push(Stmt::Break);
            }
            syn::Expr::Continue(c) => {
                if c.label.is_some() {
                    return err(c, "`continue` takes no label in a kernel");
                }
                if self.loops == 0 {
                    return err(c, "`continue` outside a loop");
                }
                out.push(Stmt::Continue);
            }
            syn::Expr::Return(r) => {
                if let Some(v) = &r.expr {
                    return err(v, "a kernel returns nothing");
                }
                out.push(Stmt::Return);
            }
            syn::Expr::Call(_) | syn::Expr::MethodCall(_) => {
                if let Some((h, c)) = self.helper_call(e) {
                    if self.inline(h, c, out)?.is_some() {
                        return err(e, format!("the value of helper `{}` is not used", h.name));
                    }
                    return Ok(());
                }
                let mut v = self.expr(e)?;
                let effect = match &v.kind {
                    ExprKind::Call(f, _) => f.has_effect(),
                    ExprKind::Raw(..) => true,
                    _ => false,
                };
                if !effect {
                    return err(e, "the value of this call is not used");
                }
                settle_default(&mut v, e)?;
                out.push(Stmt::Expr(v));
            }
            syn::Expr::Match(m) => {
                return err(m.match_token, "`match` is not available in a kernel; use `if` / `else if`");
            }
            other => return err(other, "this expression is not a statement of a kernel body"),
        }
        Ok(())
    }

    fn if_stmt(&mut self, i: &syn::ExprIf) -> syn::Result<Stmt> {
        let mut cond = self.expr(&i.cond)?;
        coerce(&mut cond, Type::BOOL, &i.cond)?;
        let then = self.block(&i.then_branch)?;
        let els = match &i.else_branch {
            None => vec![],
            Some((_, e)) => match &**e {
                syn::Expr::Block(b) => self.block(&b.block)?,
                syn::Expr::If(inner) => vec![self.if_stmt(inner)?],
                other => return err(other, "expected a block or `if` after `else`"),
            },
        };
        Ok(Stmt::If { cond, then, els })
    }

    fn for_loop(&mut self, f: &syn::ExprForLoop) -> syn::Result<Stmt> {
        if let Some(l) = &f.label {
            return err(l, "loop labels are not available in a kernel");
        }
        let mut unroll = Unroll::None;
        for a in &f.attrs {
            if !a.path().is_ident("unroll") {
                return err(a, "the only loop attribute is #[unroll] or #[unroll(n)]");
            }
            unroll = match &a.meta {
                syn::Meta::Path(_) => Unroll::Full,
                syn::Meta::List(l) => match l.parse_args::<syn::Expr>()? {
                    syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(n), .. }) => match n.base10_parse::<u32>()? {
                        0 => return err(n, "unroll by at least 1"),
                        n => Unroll::By(n),
                    },
                    syn::Expr::Path(p)
                        if p.path.get_ident().is_some_and(|id| {
                            self.lookup(&id.to_string()).is_some_and(|b| b.kind == Kind::Tile && b.ty == Type::U32)
                        }) =>
                    {
                        Unroll::ByTile(p.path.get_ident().map(ToString::to_string).unwrap_or_default())
                    }
                    other => return err(other, "unroll by a literal or a u32 tile parameter"),
                },
                syn::Meta::NameValue(nv) => return err(nv, "write #[unroll] or #[unroll(4)]"),
            };
        }
        let syn::Pat::Ident(pi) = &*f.pat else {
            return err(&f.pat, "a loop variable is one plain name");
        };
        if pi.mutability.is_some() {
            return err(pi, "a loop variable is immutable");
        }
        let (range, step) = match &*f.expr {
            syn::Expr::MethodCall(m) if m.method == "step_by" => {
                if m.args.len() != 1 {
                    return err(m, "`step_by` takes one step");
                }
                (strip_parens(&m.receiver), Some(&m.args[0]))
            }
            other => (other, None),
        };
        let syn::Expr::Range(r) = range else {
            return err(&f.expr, "a kernel loops over a range: `for i in a..b` or `for i in (a..b).step_by(s)`");
        };
        if matches!(r.limits, syn::RangeLimits::Closed(_)) {
            return err(r, "write the end as excluded: `a..b + 1`");
        }
        let (Some(start), Some(end)) = (&r.start, &r.end) else {
            return err(r, "a loop range needs both ends");
        };
        let mut start_e = self.expr(start)?;
        let mut end_e = self.expr(end)?;
        let ty = typing::unify(start_e.ty, end_e.ty)
            .ok_or_else(|| {
                syn::Error::new_spanned(
                    r,
                    format!("the range ends have different types: {} and {}", start_e.ty, end_e.ty),
                )
            })?
            .settled();
        let scalar = match ty {
            Type::Scalar(s) if s.is_arith_int() => s,
            t => return err(r, format!("a loop counts integers, not {t}")),
        };
        coerce(&mut start_e, ty, start)?;
        coerce(&mut end_e, ty, end)?;
        let step_e = match step {
            None => Expr::int(1, scalar),
            Some(s) => {
                let mut e = self.expr(s)?;
                coerce(&mut e, ty, s)?;
                if let Some(Lit::Int(v)) = e.as_lit()
                    && v <= 0
                {
                    return err(s, "the step must be positive");
                }
                e
            }
        };
        // A loop variable is scoped to its `for` in C too, so it keeps its Rust name unless that
        // would hide a visible binding.
        let rust_name = pi.ident.to_string();
        let var = if self.lookup(&rust_name).is_some() || kernel_dsl::emit::is_reserved(&rust_name) {
            self.fresh(&rust_name)
        } else {
            rust_name.clone()
        };
        // Inside the loop, a `let` of the same name must not redeclare it in C.
        self.used.insert(var.clone());
        self.loops += 1;
        let body = self.scoped(|cx| {
            cx.scopes
                .last_mut()
                .map(|s| s.insert(rust_name.clone(), Binding { c_name: var.clone(), ty, kind: Kind::LoopVar }));
            cx.block_stmts(&f.body.stmts)
        });
        self.loops -= 1;
        Ok(Stmt::For { var, ty: scalar, start: start_e, end: end_e, step: step_e, unroll, body: body? })
    }

    /// The target of an assignment, checked for mutability.
    fn place(&mut self, e: &syn::Expr) -> syn::Result<Expr> {
        match strip_parens(e) {
            syn::Expr::Path(p) => {
                let v = self.expr(e)?;
                let id = p.path.get_ident().map(ToString::to_string).unwrap_or_default();
                match self.lookup(&id).map(|b| b.kind) {
                    Some(Kind::Local { mutable: true }) if matches!(v.ty, Type::Scalar(_) | Type::Vector(_)) => Ok(v),
                    Some(Kind::Local { mutable: false }) => {
                        err(e, format!("cannot assign twice to immutable variable `{id}`; declare it with `let mut`"))
                    }
                    Some(Kind::LoopVar) => err(e, format!("cannot assign to the loop variable `{id}`")),
                    Some(Kind::Tile) => err(e, format!("`{id}` is a tile parameter, a compile-time constant")),
                    Some(Kind::Const(_)) => err(e, format!("`{id}` is a `const`")),
                    Some(Kind::Param) => {
                        err(e, format!("cannot assign to the parameter `{id}`; copy it into a `let mut`"))
                    }
                    _ => err(e, "cannot assign to this"),
                }
            }
            syn::Expr::Index(ix) => {
                let v = self.expr(e)?;
                let root = root_name(&ix.expr);
                let binding = root.as_deref().and_then(|r| self.lookup(r));
                match binding.map(|b| (b.kind, b.ty)) {
                    Some((_, Type::Ptr { mutable: true, .. })) => Ok(v),
                    Some((_, Type::Ptr { mutable: false, elem })) => err(
                        &ix.expr,
                        format!(
                            "`{}` is a read-only `&[{elem}]` parameter; declare it `&mut [{elem}]` to write it",
                            root.unwrap_or_default()
                        ),
                    ),
                    Some((_, Type::Array { space: Space::Shared, .. })) => Ok(v),
                    Some((Kind::Local { mutable: true }, Type::Array { .. })) => Ok(v),
                    Some((_, Type::Array { .. })) => {
                        err(&ix.expr, format!("declare `{}` with `let mut` to write it", root.unwrap_or_default()))
                    }
                    _ => err(e, "cannot assign to this"),
                }
            }
            syn::Expr::Field(fe) => {
                let v = self.expr(e)?;
                let root = root_name(&fe.base);
                match root.as_deref().and_then(|r| self.lookup(r)).map(|b| b.kind) {
                    Some(Kind::Local { mutable: true }) => Ok(v),
                    _ => err(&fe.base, "declare the vector with `let mut` to write its lanes"),
                }
            }
            other => err(other, "cannot assign to this: assign to a variable, an element or a vector lane"),
        }
    }

    // ---- expressions ----

    fn expr(&mut self, e: &syn::Expr) -> syn::Result<Expr> {
        match e {
            syn::Expr::Paren(p) => self.expr(&p.expr),
            syn::Expr::Group(g) => self.expr(&g.expr),
            syn::Expr::Lit(l) => literal(&l.lit),
            syn::Expr::Path(p) => self.path(p),
            syn::Expr::Unary(u) => {
                let op = match u.op {
                    syn::UnOp::Neg(_) => UnOp::Neg,
                    syn::UnOp::Not(_) => UnOp::Not,
                    _ => return err(u, "pointers are not dereferenced in a kernel: index them"),
                };
                let a = self.expr(&u.expr)?;
                let ty = typing::unary(op, a.ty).or_else(|m| err(u, m))?;
                // A negative literal stays a literal, so it can still take the type of what it meets.
                if op == UnOp::Neg {
                    match a.kind {
                        ExprKind::Lit(Lit::Int(v)) => return Ok(Expr::new(ExprKind::Lit(Lit::Int(-v)), ty)),
                        ExprKind::Lit(Lit::Float(v)) => return Ok(Expr::new(ExprKind::Lit(Lit::Float(-v)), ty)),
                        _ => {}
                    }
                }
                Ok(Expr::new(ExprKind::Unary(op, Box::new(a)), ty))
            }
            syn::Expr::Binary(b) => {
                let Some(op) = binary_op(&b.op) else {
                    return err(b, "compound assignment is a statement, not a value");
                };
                let mut l = self.expr(&b.left)?;
                let mut r = self.expr(&b.right)?;
                let (operand, result) = typing::binary(op, l.ty, r.ty).or_else(|m| err(b, m))?;
                if op.is_shift() {
                    if r.ty.is_open_literal() {
                        coerce(&mut r, Type::U32, &b.right)?;
                    }
                    check_literals(&r, &b.right)?;
                    // Shifting by the width or more is undefined in C (and a panic in Rust).
                    if let (Some(Lit::Int(n)), Type::Scalar(s)) = (r.as_lit(), l.ty) {
                        let bits = i128::from(s.size_bytes() * 8);
                        if !(0..bits).contains(&n) {
                            return err(b, format!("shifting a {s} by {n}: the amount must be below {bits}"));
                        }
                    }
                } else {
                    typing::settle(&mut l, operand);
                    typing::settle(&mut r, operand);
                    check_literals(&l, &b.left)?;
                    check_literals(&r, &b.right)?;
                }
                Ok(Expr::binary(op, l, r, result))
            }
            syn::Expr::Cast(c) => {
                let to = match elem(&c.ty)? {
                    Elem::Scalar(s) => s,
                    Elem::Vector(v) => return err(&c.ty, format!("cannot convert to the vector type {v} with `as`")),
                };
                let mut a = self.expr(&c.expr)?;
                if a.ty == Type::IntLit {
                    // As in Rust, `5 as f32` converts an integer; wide literals are i64.
                    let wide = matches!(a.as_lit(), Some(Lit::Int(v)) if !typing::int_fits(v, Scalar::I32));
                    typing::settle(&mut a, if wide { Type::Scalar(Scalar::I64) } else { Type::I32 });
                }
                let settled = a.ty.settled();
                typing::settle(&mut a, settled);
                check_literals(&a, &c.expr)?;
                typing::cast(a.ty, to).or_else(|m| err(c, m))?;
                Ok(Expr::cast(a, to))
            }
            syn::Expr::Index(ix) => {
                let base = self.expr(&ix.expr)?;
                let Some(elem) = base.ty.indexed() else {
                    return err(&ix.expr, format!("cannot index a value of type {}", base.ty));
                };
                let mut index = self.expr(&ix.index)?;
                if index.ty == Type::IntLit {
                    coerce(&mut index, Type::U32, &ix.index)?;
                }
                match index.ty {
                    Type::Scalar(Scalar::U32 | Scalar::I32 | Scalar::U64 | Scalar::I64) => {}
                    t => return err(&ix.index, format!("an index is u32, i32, u64 or i64, not {t}")),
                }
                Ok(Expr::new(ExprKind::Index(Box::new(base), Box::new(index)), elem.as_type()))
            }
            syn::Expr::Field(fe) => {
                let base = self.expr(&fe.base)?;
                let Type::Vector(v) = base.ty else {
                    return err(fe, format!("a {} has no fields; lanes (.x .y .z .w) belong to vectors", base.ty));
                };
                let name = match &fe.member {
                    syn::Member::Named(n) => n.to_string(),
                    syn::Member::Unnamed(i) => return err(i, "vector lanes are .x .y .z .w"),
                };
                let lane = Vector::LANE_NAMES[..usize::from(v.lanes())].iter().position(|l| *l == name);
                match lane {
                    Some(l) => Ok(Expr::new(ExprKind::Lane(Box::new(base), l as u8), Type::Scalar(v.lane()))),
                    None => err(&fe.member, format!("{v} has no lane `{name}`")),
                }
            }
            syn::Expr::If(i) => self.select(i),
            syn::Expr::Call(c) => self.call(c),
            syn::Expr::MethodCall(m) => self.method_call(m),
            syn::Expr::Repeat(r) => err(r, "an array is declared with `let`: `let mut acc = [0.0; N];`"),
            syn::Expr::Range(r) => err(r, "a range belongs in a `for` loop"),
            syn::Expr::Reference(r) => err(r, "references are not available in a kernel body"),
            other => err(other, "this expression is not available in a kernel body"),
        }
    }

    fn path(&mut self, p: &syn::ExprPath) -> syn::Result<Expr> {
        if p.qself.is_some() {
            return err(p, "qualified paths are not available in a kernel body");
        }
        if let Some(id) = p.path.get_ident() {
            let name = id.to_string();
            return match self.lookup(&name) {
                Some(b) if b.kind == Kind::Tile => Ok(Expr::new(ExprKind::Tile(b.c_name.clone()), b.ty)),
                Some(Binding { kind: Kind::Const(i), .. }) => Ok(self.constants[*i].clone()),
                Some(b) => Ok(Expr::var(&b.c_name, b.ty)),
                None => err(id, format!("cannot find `{name}` in this kernel")),
            };
        }
        let segs: Vec<String> = p.path.segments.iter().map(|s| s.ident.to_string()).collect();
        let lit = match segs.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
            ["f32", "INFINITY"] => Expr::f32(f32::INFINITY),
            ["f32", "NEG_INFINITY"] => Expr::f32(f32::NEG_INFINITY),
            ["f32", "MAX"] => Expr::f32(f32::MAX),
            ["f32", "MIN"] => Expr::f32(f32::MIN),
            ["f32", "EPSILON"] => Expr::f32(f32::EPSILON),
            ["u32", "MAX"] => Expr::u32(u32::MAX),
            ["i32", "MAX"] => Expr::int(i128::from(i32::MAX), Scalar::I32),
            ["i32", "MIN"] => Expr::int(i128::from(i32::MIN), Scalar::I32),
            _ => {
                return err(
                    p,
                    "unknown path in a kernel body (available constants: f32::{INFINITY, NEG_INFINITY, MAX, MIN, EPSILON}, u32::MAX, i32::{MAX, MIN})",
                );
            }
        };
        Ok(lit)
    }

    fn select(&mut self, i: &syn::ExprIf) -> syn::Result<Expr> {
        let value_of = |b: &syn::Block| -> syn::Result<syn::Expr> {
            match b.stmts.as_slice() {
                [syn::Stmt::Expr(e, None)] => Ok(e.clone()),
                _ => err(b, "as a value, each branch of an `if` is a single expression"),
            }
        };
        let Some((_, else_e)) = &i.else_branch else {
            return err(i, "an `if` used as a value needs an `else`");
        };
        let then_e = value_of(&i.then_branch)?;
        let else_e = match &**else_e {
            syn::Expr::Block(b) => value_of(&b.block)?,
            other => other.clone(),
        };
        let mut cond = self.expr(&i.cond)?;
        coerce(&mut cond, Type::BOOL, &i.cond)?;
        let mut a = self.expr(&then_e)?;
        let mut b = self.expr(&else_e)?;
        let ty = typing::unify(a.ty, b.ty).ok_or_else(|| {
            syn::Error::new_spanned(i, format!("the branches have different types: {} and {}", a.ty, b.ty))
        })?;
        typing::settle(&mut a, ty);
        typing::settle(&mut b, ty);
        Ok(Expr::new(ExprKind::Select(Box::new(cond), Box::new(a), Box::new(b)), ty))
    }

    fn call(&mut self, c: &syn::ExprCall) -> syn::Result<Expr> {
        let syn::Expr::Path(fp) = &*c.func else {
            return err(&c.func, "a kernel calls intrinsics by name");
        };
        let segs = &fp.path.segments;
        // f32::from_bits(u)
        if segs.len() == 2 && segs[0].ident == "f32" && segs[1].ident == "from_bits" {
            return self.intrinsic(Intrinsic::F32FromBits, c.args.iter().collect(), c);
        }
        if segs.len() != 1 {
            return err(fp, "a kernel calls intrinsics by name");
        }
        let seg = &segs[0];
        let name = seg.ident.to_string();
        let generics: Vec<&syn::GenericArgument> = match &seg.arguments {
            syn::PathArguments::None => vec![],
            syn::PathArguments::AngleBracketed(a) => a.args.iter().collect(),
            syn::PathArguments::Parenthesized(p) => return err(p, "unexpected parentheses"),
        };
        if let Some(h) = self.helpers.fns.get(&name) {
            if !generics.is_empty() {
                return err(&seg.arguments, format!("helper `{name}` takes no type arguments"));
            }
            return self.inline_expr(h, c);
        }
        match name.as_str() {
            "shared" => return err(c, "a shared array is declared with `let name = shared::<T, N>();`"),
            "raw_cuda" => return self.raw(c, &generics),
            _ => {}
        }
        let generic = match generics.as_slice() {
            [] => None,
            [syn::GenericArgument::Type(syn::Type::Path(tp))] if tp.path.get_ident().is_some() => {
                tp.path.get_ident().map(ToString::to_string)
            }
            _ => return err(&seg.arguments, "expected one type argument, like `::<u32x4>`"),
        };
        let f = Intrinsic::from_function(&name, generic.as_deref()).or_else(|m| err(seg, m))?;
        self.intrinsic(f, c.args.iter().collect(), c)
    }

    fn method_call(&mut self, m: &syn::ExprMethodCall) -> syn::Result<Expr> {
        if m.turbofish.is_some() {
            return err(&m.turbofish, "methods take no type arguments in a kernel");
        }
        let f = Intrinsic::from_method(&m.method.to_string()).or_else(|msg| err(&m.method, msg))?;
        let mut args = vec![&*m.receiver];
        args.extend(m.args.iter());
        self.intrinsic(f, args, m)
    }

    fn intrinsic(&mut self, f: Intrinsic, args: Vec<&syn::Expr>, span: &dyn ToTokens) -> syn::Result<Expr> {
        let mut lowered = args.iter().map(|a| self.expr(a)).collect::<syn::Result<Vec<_>>>()?;
        let types: Vec<Type> = lowered.iter().map(|a| a.ty).collect();
        let sig = f.signature(&types).or_else(|m| {
            // "argument N ..." messages point at that argument.
            let arg = m
                .strip_prefix("argument ")
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse::<usize>().ok());
            match arg.and_then(|n| args.get(n.wrapping_sub(1))) {
                Some(a) => err(a, format!("`{}`: {m}", name_of(span))),
                None => err(span, format!("`{}`: {m}", name_of(span))),
            }
        })?;
        for ((a, want), src) in lowered.iter_mut().zip(&sig.params).zip(&args) {
            coerce(a, *want, src)?;
        }
        Ok(Expr::call(f, lowered, sig.ret))
    }

    // ---- device functions of the helpers file ----

    /// The helper with statements that `e` calls, if it is a plain call of one.
    fn helper_call<'e>(&self, e: &'e syn::Expr) -> Option<(&'h Helper, &'e syn::ExprCall)> {
        let syn::Expr::Call(c) = strip_parens(e) else { return None };
        let syn::Expr::Path(fp) = &*c.func else { return None };
        let id = fp.path.get_ident()?;
        // A one-expression helper is lowered where it stands, as an expression (`call`).
        self.helpers.fns.get(&id.to_string()).filter(|h| !h.is_expression()).map(|h| (h, c))
    }

    /// Expands a call of helper `h` into `out`: each value argument copied into a fresh local,
    /// each reference argument aliased by name, then the helper's body lowered where it sees its
    /// parameters and the kernel's tiles only (no caller's local, no caller's loop to `break`
    /// from). Returns the value of its last expression when it declares one. An error inside the
    /// body is reported at the call, with the helper named.
    fn inline(&mut self, h: &Helper, c: &syn::ExprCall, out: &mut Vec<Stmt>) -> syn::Result<Option<Expr>> {
        let name = h.name.to_string();
        if self.expanding.contains(&name) {
            return err(c, format!("helper `{name}` calls itself (helpers are expanded in place)"));
        }
        if c.args.len() != h.params.len() {
            return err(c, format!("helper `{name}` takes {} arguments, {} given", h.params.len(), c.args.len()));
        }
        let mut scope = self.tile_scope();
        for (p, a) in h.params.iter().zip(&c.args) {
            let pname = p.name.to_string();
            let binding = match p.pass {
                Pass::Value { ty, mutable } => {
                    let mut v = self.expr(a)?;
                    coerce(&mut v, ty, a)?;
                    let c_name = self.fresh(&pname);
                    self.used.insert(c_name.clone());
                    out.push(Stmt::Let { name: c_name.clone(), ty, mutable, init: v });
                    Binding { c_name, ty, kind: Kind::Local { mutable } }
                }
                Pass::Ref { elem: want, mutable } => {
                    let found = match strip_parens(a) {
                        syn::Expr::Path(ap) => ap.path.get_ident().and_then(|id| self.lookup(&id.to_string())).cloned(),
                        _ => None,
                    };
                    let Some(b) = found else {
                        return err(a, format!("helper `{name}`: `{pname}` takes a buffer or an array by its name"));
                    };
                    let (elem_found, writable) = match (b.ty, b.kind) {
                        (Type::Ptr { elem, mutable }, _) => (Some(elem), mutable),
                        (Type::Array { elem, .. }, Kind::Local { mutable }) => (Some(elem), mutable),
                        _ => (None, false),
                    };
                    if elem_found != Some(want) {
                        return err(
                            a,
                            format!("helper `{name}`: `{pname}` takes a buffer or an array of {want}, not {}", b.ty),
                        );
                    }
                    if mutable && !writable {
                        return err(
                            a,
                            format!("helper `{name}`: `{pname}` writes, and this buffer or array is read-only"),
                        );
                    }
                    // The helper writes only through `&mut` parameters.
                    let (ty, kind) = match (b.ty, b.kind) {
                        (Type::Ptr { elem, .. }, k) => (Type::Ptr { elem, mutable }, k),
                        (t, Kind::Local { .. }) => (t, Kind::Local { mutable }),
                        (t, k) => (t, k),
                    };
                    Binding { c_name: b.c_name, ty, kind }
                }
            };
            scope.insert(pname, binding);
        }
        let scopes = std::mem::replace(&mut self.scopes, vec![scope]);
        let loops = std::mem::replace(&mut self.loops, 0);
        self.expanding.push(name.clone());
        let body = self.helper_body(h, out);
        self.expanding.pop();
        self.loops = loops;
        self.scopes = scopes;
        body.map_err(|e| syn::Error::new_spanned(c, format!("in helper `{name}` ({}): {e}", h.path)))
    }

    /// A call of a helper that is one expression (`fn order_key(b: u32) -> u32 { ... }`), inside
    /// another expression: the helper's expression with each parameter replaced by its argument.
    /// An argument may then be evaluated more than once, so it must have no effect; a helper
    /// with statements is called as a statement of its own or as the value of a `let` instead.
    fn inline_expr(&mut self, h: &'h Helper, c: &syn::ExprCall) -> syn::Result<Expr> {
        let name = h.name.to_string();
        let (Some(ret), [syn::Stmt::Expr(body, None)]) = (h.ret, h.block.stmts.as_slice()) else {
            return err(
                c,
                format!("helper `{name}` has statements: call it as a statement of its own or as the value of a `let`"),
            );
        };
        if self.expanding.contains(&name) {
            return err(c, format!("helper `{name}` calls itself (helpers are expanded in place)"));
        }
        if c.args.len() != h.params.len() {
            return err(c, format!("helper `{name}` takes {} arguments, {} given", h.params.len(), c.args.len()));
        }
        let mut scope = self.tile_scope();
        let mut args = Vec::new();
        for (p, a) in h.params.iter().zip(&c.args) {
            let Pass::Value { ty, mutable: false } = p.pass else {
                return err(a, format!("helper `{name}` inside an expression takes values, not `mut` or references"));
            };
            let mut v = self.expr(a)?;
            coerce(&mut v, ty, a)?;
            let mut effect = false;
            v.visit(&mut |e| {
                effect |=
                    matches!(&e.kind, ExprKind::Call(f, _) if f.has_effect()) || matches!(e.kind, ExprKind::Raw(..))
            });
            if effect {
                return err(
                    a,
                    format!(
                        "an argument of helper `{name}` inside an expression may be evaluated more than once, so it has no effect"
                    ),
                );
            }
            // A name no Rust identifier can take, replaced by the argument below.
            let stand_in = format!("{name} argument {}", self.stand_ins);
            self.stand_ins += 1;
            scope.insert(
                p.name.to_string(),
                Binding { c_name: stand_in.clone(), ty, kind: Kind::Local { mutable: false } },
            );
            args.push((stand_in, v));
        }
        let scopes = std::mem::replace(&mut self.scopes, vec![scope]);
        self.expanding.push(name.clone());
        let value = self.expr(body).and_then(|mut v| coerce(&mut v, ret, body).map(|()| v));
        self.expanding.pop();
        self.scopes = scopes;
        let mut value =
            value.map_err(|e| syn::Error::new_spanned(c, format!("in helper `{name}` ({}): {e}", h.path)))?;
        substitute(&mut value, &args);
        Ok(value)
    }

    /// The kernel's tiles, the only names of the kernel a helper sees.
    fn tile_scope(&self) -> HashMap<String, Binding> {
        match self.scopes.first() {
            Some(kernel) => {
                kernel.iter().filter(|(_, b)| b.kind == Kind::Tile).map(|(n, b)| (n.clone(), b.clone())).collect()
            }
            None => HashMap::new(),
        }
    }

    /// A helper's statements into `out`, and the value of its last expression if it returns one.
    fn helper_body(&mut self, h: &Helper, out: &mut Vec<Stmt>) -> syn::Result<Option<Expr>> {
        let stmts = &h.block.stmts;
        let (init, last) = match (h.ret, stmts.split_last()) {
            (Some(_), Some((syn::Stmt::Expr(e, None), init))) => (init, Some(e)),
            (Some(_), _) => return err(&h.block, "a helper with `-> T` ends with the value it returns"),
            (None, _) => (&stmts[..], None),
        };
        let mut body = Vec::new();
        for s in init {
            self.stmt(s, &mut body)?;
        }
        let mut early = false;
        for s in &body {
            s.visit(&mut |s| early |= matches!(s, Stmt::Return));
        }
        if early {
            return err(
                &h.block,
                "a helper has no `return`: it is expanded into the kernel, where it would end the thread",
            );
        }
        out.extend(body);
        match (h.ret, last) {
            (Some(ret), Some(e)) => {
                let mut v = self.expr(e)?;
                coerce(&mut v, ret, e)?;
                Ok(Some(v))
            }
            _ => Ok(None),
        }
    }

    /// `raw_cuda::<T>("text with {0} {1}", a, b)`: CUDA the DSL lacks, typed by the caller.
    fn raw(&mut self, c: &syn::ExprCall, generics: &[&syn::GenericArgument]) -> syn::Result<Expr> {
        let ty = match generics {
            [syn::GenericArgument::Type(syn::Type::Tuple(t))] if t.elems.is_empty() => Type::Void,
            [syn::GenericArgument::Type(t)] => elem(t)?.as_type(),
            _ => return err(c, "write the result type: `raw_cuda::<u32>(\"...\", args)`, or `::<()>` for none"),
        };
        let mut args = c.args.iter();
        let text = match args.next() {
            Some(syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. })) => s.value(),
            _ => return err(c, "the first argument of `raw_cuda` is a string literal"),
        };
        let mut lowered = Vec::new();
        for a in args {
            let mut e = self.expr(a)?;
            settle_default(&mut e, a)?;
            lowered.push(e);
        }
        for i in 0..lowered.len() {
            if !text.contains(&format!("{{{i}}}")) {
                return err(c, format!("argument {i} is not used: the text has no `{{{i}}}`"));
            }
        }
        Ok(Expr::new(ExprKind::Raw(text, lowered), ty))
    }
}

/// Replaces each stand-in variable of `args` in `e` by its argument.
fn substitute(e: &mut Expr, args: &[(String, Expr)]) {
    match &mut e.kind {
        ExprKind::Var(name) => {
            if let Some((_, a)) = args.iter().find(|(n, _)| n == name) {
                *e = a.clone();
            }
        }
        ExprKind::Lit(_) | ExprKind::Tile(_) => {}
        ExprKind::Unary(_, a) | ExprKind::Cast(a) | ExprKind::Lane(a, _) => substitute(a, args),
        ExprKind::Binary(_, a, b) | ExprKind::Index(a, b) => {
            substitute(a, args);
            substitute(b, args);
        }
        ExprKind::Select(c, a, b) => {
            substitute(c, args);
            substitute(a, args);
            substitute(b, args);
        }
        ExprKind::Call(_, xs) | ExprKind::Raw(_, xs) => xs.iter_mut().for_each(|x| substitute(x, args)),
    }
}

/// The leading tokens of a spanned node, for messages like "`max`: takes 2 arguments".
fn name_of(t: &dyn ToTokens) -> String {
    let s = t.to_token_stream().to_string();
    let s = s.split('(').next().unwrap_or(&s).trim().replace(' ', "");
    s.rsplit('.').next().unwrap_or(&s).to_owned()
}

/// Gives `e` the type `want`, or reports at `src` why it cannot have it.
fn coerce(e: &mut Expr, want: Type, src: &dyn ToTokens) -> syn::Result<()> {
    match typing::unify(e.ty, want) {
        Some(t) if t == want || (want.is_open_literal() && t == e.ty) => {
            typing::settle(e, want);
            check_literals(e, src)
        }
        _ => err(src, format!("expected {want}, found {}", e.ty)),
    }
}

/// Settles an open literal type to its default (u32, f32).
fn settle_default(e: &mut Expr, src: &dyn ToTokens) -> syn::Result<()> {
    let t = e.ty.settled();
    typing::settle(e, t);
    check_literals(e, src)
}

/// Every integer literal in `e` fits its type.
fn check_literals(e: &Expr, src: &dyn ToTokens) -> syn::Result<()> {
    let mut bad = None;
    e.visit(&mut |x| {
        if let (ExprKind::Lit(Lit::Int(v)), Type::Scalar(s)) = (&x.kind, x.ty)
            && !typing::int_fits(*v, s)
            && bad.is_none()
        {
            bad = Some((*v, s));
        }
    });
    match bad {
        Some((v, s)) => err(src, format!("the literal {v} does not fit in {s}")),
        None => Ok(()),
    }
}

fn literal(l: &syn::Lit) -> syn::Result<Expr> {
    match l {
        syn::Lit::Int(i) => {
            let v: i128 = i.base10_parse()?;
            let ty = match i.suffix() {
                "" => Type::IntLit,
                s => match Scalar::from_rust_name(s) {
                    Some(sc) if sc.is_int() => Type::Scalar(sc),
                    Some(Scalar::F32) => return Ok(Expr::new(ExprKind::Lit(Lit::Float(v as f64)), Type::F32)),
                    _ => return err(i, format!("`{s}` is not an integer type of kernels")),
                },
            };
            Ok(Expr::new(ExprKind::Lit(Lit::Int(v)), ty))
        }
        syn::Lit::Float(f) => {
            let v: f64 = f.base10_parse()?;
            let ty = match f.suffix() {
                "" => Type::FloatLit,
                "f32" => Type::F32,
                s => return err(f, format!("`{s}`: kernels compute in f32")),
            };
            Ok(Expr::new(ExprKind::Lit(Lit::Float(v)), ty))
        }
        syn::Lit::Bool(b) => Ok(Expr::bool(b.value)),
        other => err(other, "only numbers and booleans are literals in a kernel"),
    }
}

fn binary_op(op: &syn::BinOp) -> Option<BinOp> {
    use syn::BinOp as B;
    Some(match op {
        B::Add(_) => BinOp::Add,
        B::Sub(_) => BinOp::Sub,
        B::Mul(_) => BinOp::Mul,
        B::Div(_) => BinOp::Div,
        B::Rem(_) => BinOp::Rem,
        B::And(_) => BinOp::And,
        B::Or(_) => BinOp::Or,
        B::BitXor(_) => BinOp::BitXor,
        B::BitAnd(_) => BinOp::BitAnd,
        B::BitOr(_) => BinOp::BitOr,
        B::Shl(_) => BinOp::Shl,
        B::Shr(_) => BinOp::Shr,
        B::Eq(_) => BinOp::Eq,
        B::Lt(_) => BinOp::Lt,
        B::Le(_) => BinOp::Le,
        B::Ne(_) => BinOp::Ne,
        B::Ge(_) => BinOp::Ge,
        B::Gt(_) => BinOp::Gt,
        _ => return None,
    })
}

fn compound_op(op: &syn::BinOp) -> Option<BinOp> {
    use syn::BinOp as B;
    Some(match op {
        B::AddAssign(_) => BinOp::Add,
        B::SubAssign(_) => BinOp::Sub,
        B::MulAssign(_) => BinOp::Mul,
        B::DivAssign(_) => BinOp::Div,
        B::RemAssign(_) => BinOp::Rem,
        B::BitXorAssign(_) => BinOp::BitXor,
        B::BitAndAssign(_) => BinOp::BitAnd,
        B::BitOrAssign(_) => BinOp::BitOr,
        B::ShlAssign(_) => BinOp::Shl,
        B::ShrAssign(_) => BinOp::Shr,
        _ => return None,
    })
}

fn is_block_like(e: &syn::Expr) -> bool {
    matches!(
        e,
        syn::Expr::If(_)
            | syn::Expr::ForLoop(_)
            | syn::Expr::While(_)
            | syn::Expr::Loop(_)
            | syn::Expr::Block(_)
            | syn::Expr::Match(_)
    )
}

/// The outer attributes of a statement expression.
fn expr_attrs(e: &syn::Expr) -> &[syn::Attribute] {
    match e {
        syn::Expr::If(x) => &x.attrs,
        syn::Expr::While(x) => &x.attrs,
        syn::Expr::Loop(x) => &x.attrs,
        syn::Expr::Block(x) => &x.attrs,
        syn::Expr::Assign(x) => &x.attrs,
        syn::Expr::Binary(x) => &x.attrs,
        syn::Expr::Call(x) => &x.attrs,
        syn::Expr::MethodCall(x) => &x.attrs,
        syn::Expr::Break(x) => &x.attrs,
        syn::Expr::Continue(x) => &x.attrs,
        syn::Expr::Return(x) => &x.attrs,
        _ => &[],
    }
}

fn strip_parens(e: &syn::Expr) -> &syn::Expr {
    match e {
        syn::Expr::Paren(p) => strip_parens(&p.expr),
        syn::Expr::Group(g) => strip_parens(&g.expr),
        e => e,
    }
}

/// The variable an index or lane expression starts from.
fn root_name(e: &syn::Expr) -> Option<String> {
    match strip_parens(e) {
        syn::Expr::Path(p) => p.path.get_ident().map(ToString::to_string),
        syn::Expr::Index(ix) => root_name(&ix.expr),
        syn::Expr::Field(f) => root_name(&f.base),
        _ => None,
    }
}

/// Recognises `shared::<T, N>()` and returns its element type and length expression.
fn shared_call(e: &syn::Expr) -> syn::Result<Option<(Elem, syn::Expr)>> {
    let syn::Expr::Call(c) = strip_parens(e) else { return Ok(None) };
    let syn::Expr::Path(p) = &*c.func else { return Ok(None) };
    let [seg] = p.path.segments.iter().collect::<Vec<_>>()[..] else { return Ok(None) };
    if seg.ident != "shared" {
        return Ok(None);
    }
    if !c.args.is_empty() {
        return err(&c.args, "`shared::<T, N>()` takes no arguments");
    }
    let syn::PathArguments::AngleBracketed(a) = &seg.arguments else {
        return err(seg, "write the element type and length: `shared::<f32, 256>()`");
    };
    let args: Vec<_> = a.args.iter().collect();
    let [syn::GenericArgument::Type(t), len] = args[..] else {
        return err(a, "write the element type and length: `shared::<f32, 256>()`");
    };
    let len = match len {
        syn::GenericArgument::Const(e) => e.clone(),
        // A bare name (`WARPS`) parses as a type argument.
        syn::GenericArgument::Type(syn::Type::Path(tp)) => {
            syn::Expr::Path(syn::ExprPath { attrs: vec![], qself: None, path: tp.path.clone() })
        }
        other => return err(other, "the length is a constant expression: `256`, `WARPS` or `{ WARPS * 2 }`"),
    };
    let len = match len {
        syn::Expr::Block(b) => match b.block.stmts.as_slice() {
            [syn::Stmt::Expr(e, None)] => e.clone(),
            _ => return err(&b, "the length is one expression"),
        },
        e => e,
    };
    Ok(Some((elem(t)?, len)))
}
