//! Writes the lowered IR back out as Rust code that rebuilds it: the template a kernel's
//! `KernelDef::template()` returns.

use kernel_dsl::intrinsic::Intrinsic;
use kernel_dsl::ir::{Expr, ExprKind, Lit, Param, Stmt, TileType, Unroll};
use kernel_dsl::types::{Elem, Space, Type};
use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use crate::paths;

/// Rust code that evaluates to the value.
pub(crate) trait Rebuild {
    fn rebuild(&self) -> TokenStream;
}

/// A fieldless enum value, by its variant name.
fn variant(path: TokenStream, v: &impl std::fmt::Debug) -> TokenStream {
    let id = format_ident!("{}", format!("{v:?}"));
    quote!(#path::#id)
}

fn string(s: &str) -> TokenStream {
    quote!(::std::string::String::from(#s))
}

impl Rebuild for Elem {
    fn rebuild(&self) -> TokenStream {
        let t = paths::types();
        match self {
            Elem::Scalar(s) => {
                let s = variant(quote!(#t::Scalar), s);
                quote!(#t::Elem::Scalar(#s))
            }
            Elem::Vector(v) => {
                let v = variant(quote!(#t::Vector), v);
                quote!(#t::Elem::Vector(#v))
            }
        }
    }
}

impl Rebuild for Type {
    fn rebuild(&self) -> TokenStream {
        let t = paths::types();
        match self {
            Type::Void => quote!(#t::Type::Void),
            Type::Scalar(s) => {
                let s = variant(quote!(#t::Scalar), s);
                quote!(#t::Type::Scalar(#s))
            }
            Type::Vector(v) => {
                let v = variant(quote!(#t::Vector), v);
                quote!(#t::Type::Vector(#v))
            }
            Type::Ptr { elem, mutable } => {
                let e = elem.rebuild();
                quote!(#t::Type::Ptr { elem: #e, mutable: #mutable })
            }
            Type::Array { elem, space } => {
                let e = elem.rebuild();
                let s = space.rebuild();
                quote!(#t::Type::Array { elem: #e, space: #s })
            }
            Type::IntLit => quote!(#t::Type::IntLit),
            Type::FloatLit => quote!(#t::Type::FloatLit),
        }
    }
}

impl Rebuild for Space {
    fn rebuild(&self) -> TokenStream {
        let t = paths::types();
        variant(quote!(#t::Space), self)
    }
}

impl Rebuild for Intrinsic {
    fn rebuild(&self) -> TokenStream {
        let dsl = paths::dsl();
        let path = quote!(#dsl::intrinsic::Intrinsic);
        match self {
            Intrinsic::LoadVec(v) | Intrinsic::LoadStream(v) | Intrinsic::LoadEarly(v) | Intrinsic::Make(v) => {
                let t = paths::types();
                let v = variant(quote!(#t::Vector), v);
                let name = match self {
                    Intrinsic::LoadVec(_) => format_ident!("LoadVec"),
                    Intrinsic::LoadStream(_) => format_ident!("LoadStream"),
                    Intrinsic::LoadEarly(_) => format_ident!("LoadEarly"),
                    _ => format_ident!("Make"),
                };
                quote!(#path::#name(#v))
            }
            other => variant(path, other),
        }
    }
}

impl Rebuild for Expr {
    fn rebuild(&self) -> TokenStream {
        let ir = paths::ir();
        let ty = self.ty.rebuild();
        let bx = |e: &Expr| {
            let e = e.rebuild();
            quote!(::std::boxed::Box::new(#e))
        };
        let kind = match &self.kind {
            ExprKind::Lit(Lit::Int(v)) => {
                let v = Literal::i128_suffixed(*v);
                quote!(#ir::ExprKind::Lit(#ir::Lit::Int(#v)))
            }
            ExprKind::Lit(Lit::Float(v)) => {
                let v = if v.is_finite() {
                    let l = Literal::f64_suffixed(*v);
                    quote!(#l)
                } else if *v > 0.0 {
                    quote!(::core::f64::INFINITY)
                } else {
                    quote!(::core::f64::NEG_INFINITY)
                };
                quote!(#ir::ExprKind::Lit(#ir::Lit::Float(#v)))
            }
            ExprKind::Lit(Lit::Bool(b)) => quote!(#ir::ExprKind::Lit(#ir::Lit::Bool(#b))),
            ExprKind::Var(n) => {
                let n = string(n);
                quote!(#ir::ExprKind::Var(#n))
            }
            ExprKind::Tile(n) => {
                let n = string(n);
                quote!(#ir::ExprKind::Tile(#n))
            }
            ExprKind::Unary(op, a) => {
                let op = variant(quote!(#ir::UnOp), op);
                let a = bx(a);
                quote!(#ir::ExprKind::Unary(#op, #a))
            }
            ExprKind::Binary(op, a, b) => {
                let op = variant(quote!(#ir::BinOp), op);
                let (a, b) = (bx(a), bx(b));
                quote!(#ir::ExprKind::Binary(#op, #a, #b))
            }
            ExprKind::Cast(a) => {
                let a = bx(a);
                quote!(#ir::ExprKind::Cast(#a))
            }
            ExprKind::Index(a, b) => {
                let (a, b) = (bx(a), bx(b));
                quote!(#ir::ExprKind::Index(#a, #b))
            }
            ExprKind::Lane(a, l) => {
                let a = bx(a);
                quote!(#ir::ExprKind::Lane(#a, #l))
            }
            ExprKind::Call(f, args) => {
                let f = f.rebuild();
                let args = args.iter().map(Rebuild::rebuild);
                quote!(#ir::ExprKind::Call(#f, ::std::vec![#(#args),*]))
            }
            ExprKind::Select(c, a, b) => {
                let (c, a, b) = (bx(c), bx(a), bx(b));
                quote!(#ir::ExprKind::Select(#c, #a, #b))
            }
            ExprKind::Raw(text, args) => {
                let text = string(text);
                let args = args.iter().map(Rebuild::rebuild);
                quote!(#ir::ExprKind::Raw(#text, ::std::vec![#(#args),*]))
            }
        };
        quote!(#ir::Expr { kind: #kind, ty: #ty })
    }
}

impl Rebuild for Stmt {
    fn rebuild(&self) -> TokenStream {
        let ir = paths::ir();
        let block = |b: &[Stmt]| {
            let s = b.iter().map(Rebuild::rebuild);
            quote!(::std::vec![#(#s),*])
        };
        match self {
            Stmt::Let { name, ty, mutable, init } => {
                let (name, ty, init) = (string(name), ty.rebuild(), init.rebuild());
                quote!(#ir::Stmt::Let { name: #name, ty: #ty, mutable: #mutable, init: #init })
            }
            Stmt::Array { name, elem, len, space, fill } => {
                let (name, elem, len, space) = (string(name), elem.rebuild(), len.rebuild(), space.rebuild());
                let fill = match fill {
                    Some(f) => {
                        let f = f.rebuild();
                        quote!(::std::option::Option::Some(#f))
                    }
                    None => quote!(::std::option::Option::None),
                };
                quote!(#ir::Stmt::Array { name: #name, elem: #elem, len: #len, space: #space, fill: #fill })
            }
            Stmt::Assign { place, op, value } => {
                let (place, value) = (place.rebuild(), value.rebuild());
                let op = match op {
                    Some(o) => {
                        let o = variant(quote!(#ir::BinOp), o);
                        quote!(::std::option::Option::Some(#o))
                    }
                    None => quote!(::std::option::Option::None),
                };
                quote!(#ir::Stmt::Assign { place: #place, op: #op, value: #value })
            }
            Stmt::If { cond, then, els } => {
                let (cond, then, els) = (cond.rebuild(), block(then), block(els));
                quote!(#ir::Stmt::If { cond: #cond, then: #then, els: #els })
            }
            Stmt::For { var, ty, start, end, step, unroll, body } => {
                let t = paths::types();
                let var = string(var);
                let ty = variant(quote!(#t::Scalar), ty);
                let (start, end, step, body) = (start.rebuild(), end.rebuild(), step.rebuild(), block(body));
                let unroll = match unroll {
                    Unroll::None => quote!(#ir::Unroll::None),
                    Unroll::Full => quote!(#ir::Unroll::Full),
                    Unroll::By(n) => quote!(#ir::Unroll::By(#n)),
                    Unroll::ByTile(t) => {
                        let t = string(t);
                        quote!(#ir::Unroll::ByTile(#t))
                    }
                };
                quote!(#ir::Stmt::For { var: #var, ty: #ty, start: #start, end: #end, step: #step, unroll: #unroll, body: #body })
            }
            Stmt::While { cond, body } => {
                let (cond, body) = (cond.rebuild(), block(body));
                quote!(#ir::Stmt::While { cond: #cond, body: #body })
            }
            Stmt::Break => quote!(#ir::Stmt::Break),
            Stmt::Continue => quote!(#ir::Stmt::Continue),
            Stmt::Return => quote!(#ir::Stmt::Return),
            Stmt::Expr(e) => {
                let e = e.rebuild();
                quote!(#ir::Stmt::Expr(#e))
            }
        }
    }
}

impl Rebuild for Param {
    fn rebuild(&self) -> TokenStream {
        let ir = paths::ir();
        let (name, ty) = (string(&self.name), self.ty.rebuild());
        quote!(#ir::Param { name: #name, ty: #ty })
    }
}

impl Rebuild for TileType {
    fn rebuild(&self) -> TokenStream {
        let ir = paths::ir();
        variant(quote!(#ir::TileType), self)
    }
}
