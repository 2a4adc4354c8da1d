//! The `#[kernel(...)]` attribute: the block size (from tiles alone), the grid (from tiles and
//! scalar arguments), the requirements, which are checked before any launch, `cooperative` for a
//! kernel whose blocks wait for each other (every launch then a cooperative one), and `helpers`,
//! the file of device functions the body calls (`super::helpers`).

use std::collections::BTreeSet;

use syn::punctuated::Punctuated;
use syn::visit::Visit;
use syn::{Expr, Ident, Meta, Token};

/// A `require(...)` condition.
pub(crate) struct Requirement {
    pub(crate) expr: Expr,
    /// The tile and argument names it reads, for the error message.
    pub(crate) names: Vec<Ident>,
    /// True when it reads tiles only: then it constrains the tile space and is checked when a
    /// kernel is specialised; otherwise it is checked for each launch.
    pub(crate) tiles_only: bool,
}

pub(crate) struct LaunchDecl {
    pub(crate) block: Expr,
    /// One to three dimensions.
    pub(crate) grid: Vec<Expr>,
    /// `min_blocks = ...` (tiles alone): blocks of this kernel that must fit on one SM together,
    /// the second argument of `__launch_bounds__`. ptxas budgets registers to it; a kernel that
    /// loads a batch before using it needs the budget to keep the batch in flight.
    pub(crate) min_blocks: Option<Expr>,
    /// `max_blocks = ...` (tiles alone): at most this many blocks of this kernel on one SM, 0 for
    /// no bound. A launch property, not a compile one: the engine reserves enough dynamic shared
    /// memory at load that no more fit, so that a grid launched while its predecessor still runs
    /// spreads over the SMs instead of piling onto the few with room.
    pub(crate) max_blocks: Option<Expr>,
    pub(crate) requires: Vec<Requirement>,
    /// `cooperative`: the blocks meet at software grid barriers, so they must all be resident at
    /// once; the launch asks the driver to guarantee it.
    pub(crate) cooperative: bool,
    /// `helpers = "path"` or `helpers = ["a", "b"]`: the files of device functions the body calls.
    pub(crate) helpers: Vec<syn::LitStr>,
}

/// The names a launch expression may read.
pub(crate) struct Scope<'a> {
    pub(crate) tiles: &'a [Ident],
    pub(crate) scalars: &'a [Ident],
}

pub(crate) fn parse(attr: proc_macro2::TokenStream, scope: &Scope<'_>) -> syn::Result<LaunchDecl> {
    let metas = syn::parse::Parser::parse2(Punctuated::<Meta, Token![,]>::parse_terminated, attr.clone())?;
    let mut block = None;
    let mut grid = None;
    let mut min_blocks = None;
    let mut max_blocks = None;
    let mut requires = Vec::new();
    let mut cooperative = false;
    let mut helpers = Vec::new();
    for meta in metas {
        match meta {
            Meta::NameValue(nv) if nv.path.is_ident("block") => {
                tiles_alone(
                    &nv.value,
                    scope,
                    "the block size depends on tiles alone (it is the kernel's __launch_bounds__)",
                )?;
                block = Some(nv.value);
            }
            Meta::NameValue(nv) if nv.path.is_ident("min_blocks") => {
                let why = "`min_blocks` depends on tiles alone (it is the second argument of __launch_bounds__)";
                bound_once(&mut min_blocks, nv, scope, why)?;
            }
            Meta::NameValue(nv) if nv.path.is_ident("max_blocks") => {
                let why =
                    "`max_blocks` depends on tiles alone (the engine bounds the residency when it loads the kernel)";
                bound_once(&mut max_blocks, nv, scope, why)?;
            }
            Meta::NameValue(nv) if nv.path.is_ident("grid") => {
                let dims: Vec<Expr> = match nv.value {
                    Expr::Tuple(t) => t.elems.into_iter().collect(),
                    e => vec![e],
                };
                if dims.is_empty() || dims.len() > 3 {
                    return Err(syn::Error::new_spanned(&nv.path, "the grid has one to three dimensions"));
                }
                for d in &dims {
                    names_in(d, scope)?;
                }
                grid = Some(dims);
            }
            Meta::List(list) if list.path.is_ident("require") => {
                let exprs = list.parse_args_with(Punctuated::<Expr, Token![,]>::parse_terminated)?;
                for expr in exprs {
                    let names: Vec<Ident> = names_in(&expr, scope)?.into_iter().collect();
                    let tiles_only = names.iter().all(|n| scope.tiles.contains(n));
                    requires.push(Requirement { expr, names, tiles_only });
                }
            }
            Meta::NameValue(nv) if nv.path.is_ident("helpers") => {
                if !helpers.is_empty() {
                    return Err(syn::Error::new_spanned(&nv.path, "`helpers` is given twice"));
                }
                let paths: Vec<&Expr> = match &nv.value {
                    Expr::Array(a) => a.elems.iter().collect(),
                    e => vec![e],
                };
                for p in paths {
                    let Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(path), .. }) = p else {
                        return Err(syn::Error::new_spanned(
                            p,
                            "`helpers` is a path in a string literal, or a list of them: `[\"a.rs\", \"b.rs\"]`",
                        ));
                    };
                    helpers.push(path.clone());
                }
            }
            Meta::Path(p) if p.is_ident("cooperative") => {
                if cooperative {
                    return Err(syn::Error::new_spanned(p, "`cooperative` is given twice"));
                }
                cooperative = true;
            }
            other => {
                return Err(syn::Error::new_spanned(
                    other,
                    "expected `block = ...`, `grid = ...`, `min_blocks = ...`, `max_blocks = ...`, `require(...)`, `cooperative` or `helpers = \"path\"` in #[kernel(...)]",
                ));
            }
        }
    }
    let missing =
        |what: &str| syn::Error::new(proc_macro2::Span::call_site(), format!("#[kernel] needs `{what} = ...`"));
    Ok(LaunchDecl {
        block: block.ok_or_else(|| missing("block"))?,
        grid: grid.ok_or_else(|| missing("grid"))?,
        min_blocks,
        max_blocks,
        requires,
        cooperative,
        helpers,
    })
}

/// A residency bound (`min_blocks`, `max_blocks`) into `slot`: tiles alone (`why` says why),
/// given once.
fn bound_once(slot: &mut Option<Expr>, nv: syn::MetaNameValue, scope: &Scope<'_>, why: &str) -> syn::Result<()> {
    tiles_alone(&nv.value, scope, why)?;
    if slot.is_some() {
        let name = nv.path.get_ident().map(|i| i.to_string()).unwrap_or_default();
        return Err(syn::Error::new_spanned(&nv.path, format!("`{name}` is given twice")));
    }
    *slot = Some(nv.value);
    Ok(())
}

/// An error at the first scalar argument `expr` reads: what `__launch_bounds__` takes is fixed
/// when the kernel is specialised, before any launch.
fn tiles_alone(expr: &Expr, scope: &Scope<'_>, message: &str) -> syn::Result<()> {
    match names_in(expr, scope)?.iter().find(|n| scope.scalars.contains(n)) {
        Some(arg) => Err(syn::Error::new_spanned(arg, message)),
        None => Ok(()),
    }
}

/// The tile and scalar names an expression reads; an unknown name is an error at its span.
fn names_in(expr: &Expr, scope: &Scope<'_>) -> syn::Result<BTreeSet<Ident>> {
    struct Names<'a> {
        scope: &'a Scope<'a>,
        found: BTreeSet<Ident>,
        error: Option<syn::Error>,
    }
    impl<'ast> Visit<'ast> for Names<'_> {
        fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
            // The function (div_ceil, max, ...) is host Rust; only its arguments are names to check.
            for arg in &call.args {
                self.visit_expr(arg);
            }
        }
        fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
            self.visit_expr(&call.receiver);
            for arg in &call.args {
                self.visit_expr(arg);
            }
        }
        fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
            if let Some(id) = p.path.get_ident() {
                if self.scope.tiles.contains(id) || self.scope.scalars.contains(id) {
                    self.found.insert(id.clone());
                } else if self.error.is_none() {
                    self.error = Some(syn::Error::new_spanned(
                        id,
                        format!("`{id}` is neither a tile nor a scalar parameter of this kernel"),
                    ));
                }
            }
        }
    }
    let mut v = Names { scope, found: BTreeSet::new(), error: None };
    v.visit_expr(expr);
    match v.error {
        Some(e) => Err(e),
        None => Ok(v.found),
    }
}
