//! `#[tile(default = 4, candidates = [1, 2, 4, 8])] NAME: u32` parameters: compile-time values the
//! emitter substitutes as constants, with the set the autotuner may choose from. A tile marked
//! `step` (`#[tile(default = 0, candidates = [0, 1], step)]`) decides how the kernel's launch meets
//! its neighbours in the decode step; the autotuner's unit harnesses cannot time it.

use kernel_dsl::TileValue;
use kernel_dsl::ir::TileType;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, Ident, Lit, Meta, Token};

/// One tile parameter.
pub(crate) struct TileDecl {
    pub(crate) name: Ident,
    pub(crate) ty: TileType,
    pub(crate) default: TileValue,
    /// Non-empty, the default among them, no repeats.
    pub(crate) candidates: Vec<TileValue>,
    /// `step`: chosen by timing the whole step (pinned tables), not a kernel's harness.
    pub(crate) chosen_in_step: bool,
}

impl TileDecl {
    /// The field of the generated `Tiles` struct: the name in lower case.
    pub(crate) fn field(&self) -> Ident {
        Ident::new(&self.name.to_string().to_lowercase(), self.name.span())
    }
}

/// Parses a parameter that carries `#[tile(..)]`.
pub(crate) fn parse(attr: &syn::Attribute, pat: &syn::PatType) -> syn::Result<TileDecl> {
    let name = match &*pat.pat {
        syn::Pat::Ident(p) if p.by_ref.is_none() && p.mutability.is_none() && p.subpat.is_none() => p.ident.clone(),
        other => return Err(syn::Error::new_spanned(other, "a tile parameter is a plain name, like `ROWS: u32`")),
    };
    let lower = name.to_string().to_lowercase();
    if syn::parse_str::<Ident>(&lower).is_err() {
        return Err(syn::Error::new_spanned(
            &name,
            format!("`{name}` cannot name a tile: `{lower}`, its field, is a Rust keyword"),
        ));
    }
    let ty = match &*pat.ty {
        syn::Type::Path(p) if p.path.is_ident("u32") => TileType::U32,
        syn::Type::Path(p) if p.path.is_ident("bool") => TileType::Bool,
        other => return Err(syn::Error::new_spanned(other, "a tile parameter is a `u32` or a `bool`")),
    };
    let metas = attr.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)?;
    let mut default = None;
    let mut candidates = None;
    let mut chosen_in_step = false;
    for meta in &metas {
        match meta {
            Meta::Path(p) if p.is_ident("step") => {
                if chosen_in_step {
                    return Err(syn::Error::new_spanned(p, "`step` is given twice"));
                }
                chosen_in_step = true;
            }
            Meta::NameValue(nv) if nv.path.is_ident("default") => default = Some(value(&nv.value, ty)?),
            Meta::NameValue(nv) if nv.path.is_ident("candidates") => {
                let Expr::Array(arr) = &nv.value else {
                    return Err(syn::Error::new_spanned(&nv.value, "candidates are a list: `candidates = [1, 2, 4]`"));
                };
                let values = arr.elems.iter().map(|e| value(e, ty)).collect::<syn::Result<Vec<_>>>()?;
                if values.is_empty() {
                    return Err(syn::Error::new_spanned(arr, "give at least one candidate"));
                }
                for (i, v) in values.iter().enumerate() {
                    if values[..i].contains(v) {
                        return Err(syn::Error::new_spanned(&arr.elems[i], format!("candidate {v} is listed twice")));
                    }
                }
                candidates = Some((values, arr.span()));
            }
            other => {
                return Err(syn::Error::new_spanned(other, "expected `default = ...`, `candidates = [...]` or `step`"));
            }
        }
    }
    let default = default.ok_or_else(|| syn::Error::new_spanned(attr, "a tile needs `default = ...`"))?;
    let candidates = match candidates {
        Some((values, span)) => {
            if !values.contains(&default) {
                return Err(syn::Error::new(span, format!("the default {default} must be one of the candidates")));
            }
            values
        }
        None if ty == TileType::Bool => vec![TileValue::Bool(false), TileValue::Bool(true)],
        None => vec![default],
    };
    Ok(TileDecl { name, ty, default, candidates, chosen_in_step })
}

fn value(e: &Expr, ty: TileType) -> syn::Result<TileValue> {
    match (e, ty) {
        (Expr::Lit(l), TileType::U32) => match &l.lit {
            Lit::Int(i) => i
                .base10_parse::<u32>()
                .map(TileValue::U32)
                .map_err(|_| syn::Error::new_spanned(i, "a u32 tile value is an integer from 0 to 4294967295")),
            other => Err(syn::Error::new_spanned(other, "a u32 tile takes integer values")),
        },
        (Expr::Lit(l), TileType::Bool) => match &l.lit {
            Lit::Bool(b) => Ok(TileValue::Bool(b.value)),
            other => Err(syn::Error::new_spanned(other, "a bool tile takes `true` or `false`")),
        },
        (other, _) => Err(syn::Error::new_spanned(other, "a tile value is a literal")),
    }
}
