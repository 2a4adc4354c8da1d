//! The whole `#[kernel]` function: visibility, name, doc comment, tile parameters, kernel
//! parameters, the attribute and the body.

use kernel_dsl::ir::{Param, Stmt};
use kernel_dsl::types::{Elem, Scalar, Type, Vector};
use proc_macro2::TokenStream;
use syn::{FnArg, Ident, ItemFn, Visibility};

use super::launch::{self, LaunchDecl};
use super::tiles::{self, TileDecl};

/// A kernel parameter: a device pointer or a scalar passed by value.
pub(crate) struct ParamDecl {
    pub(crate) name: Ident,
    pub(crate) ty: Type,
}

/// Everything `generate` needs.
pub(crate) struct KernelDecl {
    pub(crate) vis: Visibility,
    pub(crate) name: Ident,
    /// The doc comment, line by line, one leading space removed.
    pub(crate) doc: Vec<String>,
    pub(crate) tiles: Vec<TileDecl>,
    pub(crate) params: Vec<ParamDecl>,
    pub(crate) launch: LaunchDecl,
    pub(crate) body: Vec<Stmt>,
    /// The parameters as the emitted CUDA names them (C-safe forms of the Rust names).
    pub(crate) ir_params: Vec<Param>,
}

pub(crate) fn parse(attr: TokenStream, item: TokenStream) -> syn::Result<KernelDecl> {
    let f: ItemFn = syn::parse2(item)?;
    let sig = &f.sig;
    if let Some(t) = &sig.asyncness {
        return Err(syn::Error::new_spanned(t, "a kernel cannot be async"));
    }
    if let Some(t) = &sig.unsafety {
        return Err(syn::Error::new_spanned(t, "a kernel is not `unsafe fn`: launching it is what is unsafe"));
    }
    if !sig.generics.params.is_empty() {
        return Err(syn::Error::new_spanned(&sig.generics, "a kernel has no generics: use #[tile] parameters"));
    }
    if let syn::ReturnType::Type(_, t) = &sig.output {
        return Err(syn::Error::new_spanned(
            t,
            "a kernel returns nothing: write results through `&mut [T]` parameters",
        ));
    }
    if let Some(attr) = f.attrs.iter().find(|a| !a.path().is_ident("doc")) {
        return Err(syn::Error::new_spanned(attr, "only doc comments may accompany #[kernel]"));
    }

    let mut tiles = Vec::new();
    let mut params = Vec::new();
    for input in &sig.inputs {
        let FnArg::Typed(pt) = input else {
            return Err(syn::Error::new_spanned(input, "a kernel takes no `self`"));
        };
        let mut attrs = pt.attrs.iter();
        match attrs.next() {
            Some(a) if a.path().is_ident("tile") => {
                if !params.is_empty() {
                    return Err(syn::Error::new_spanned(a, "tile parameters come before the kernel parameters"));
                }
                tiles.push(tiles::parse(a, pt)?)
            }
            Some(a) => return Err(syn::Error::new_spanned(a, "the only parameter attribute is #[tile(...)]")),
            None => params.push(param(pt)?),
        }
        if let Some(a) = attrs.next() {
            return Err(syn::Error::new_spanned(a, "one attribute per parameter"));
        }
    }

    let tile_names: Vec<Ident> = tiles.iter().map(|t| t.name.clone()).collect();
    let scalar_names: Vec<Ident> =
        params.iter().filter(|p| matches!(p.ty, Type::Scalar(_))).map(|p| p.name.clone()).collect();
    let all: Vec<&Ident> = tile_names.iter().chain(params.iter().map(|p| &p.name)).collect();
    for (i, n) in all.iter().enumerate() {
        if all[..i].contains(n) {
            return Err(syn::Error::new_spanned(n, format!("`{n}` is declared twice")));
        }
    }
    for (i, t) in tiles.iter().enumerate() {
        if let Some(other) = tiles[..i].iter().find(|o| o.field() == t.field()) {
            return Err(syn::Error::new_spanned(
                &t.name,
                format!("`{}` and `{}` would share the field `{}` of `Tiles`", other.name, t.name, t.field()),
            ));
        }
    }
    let launch = launch::parse(attr, &launch::Scope { tiles: &tile_names, scalars: &scalar_names })?;
    let helpers = super::helpers::load_all(&launch.helpers)?;
    let lowered = super::body::lower(&f.block, &tiles, &params, &helpers)?;
    let ir_params = params.iter().zip(lowered.param_names).map(|(p, name)| Param { name, ty: p.ty }).collect();

    let doc = f
        .attrs
        .iter()
        .filter_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) if nv.path.is_ident("doc") => match &nv.value {
                syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => {
                    let v = s.value();
                    Some(v.strip_prefix(' ').unwrap_or(&v).trim_end().to_owned())
                }
                _ => None,
            },
            _ => None,
        })
        .collect();
    Ok(KernelDecl {
        vis: f.vis.clone(),
        name: sig.ident.clone(),
        doc,
        tiles,
        params,
        launch,
        body: lowered.body,
        ir_params,
    })
}

fn param(pt: &syn::PatType) -> syn::Result<ParamDecl> {
    let name = match &*pt.pat {
        syn::Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => {
            if let Some(m) = &p.mutability {
                return Err(syn::Error::new_spanned(m, "kernel parameters are immutable; copy into a `let mut`"));
            }
            p.ident.clone()
        }
        other => return Err(syn::Error::new_spanned(other, "a kernel parameter is a plain name")),
    };
    let ty = param_type(&pt.ty)?;
    Ok(ParamDecl { name, ty })
}

/// `&[T]`, `&mut [T]` or a scalar.
fn param_type(ty: &syn::Type) -> syn::Result<Type> {
    match ty {
        syn::Type::Reference(r) => {
            let syn::Type::Slice(s) = &*r.elem else {
                return Err(syn::Error::new_spanned(ty, "a device buffer is a slice: `&[T]` or `&mut [T]`"));
            };
            if let Some(l) = &r.lifetime {
                return Err(syn::Error::new_spanned(l, "kernel parameters carry no lifetimes"));
            }
            Ok(Type::Ptr { elem: elem(&s.elem)?, mutable: r.mutability.is_some() })
        }
        syn::Type::Path(_) => match elem(ty)? {
            Elem::Scalar(s @ (Scalar::Bool | Scalar::I32 | Scalar::U32 | Scalar::I64 | Scalar::U64 | Scalar::F32)) => {
                Ok(Type::Scalar(s))
            }
            other => Err(syn::Error::new_spanned(
                ty,
                format!("a scalar parameter is bool, i32, u32, i64, u64 or f32, not {other}"),
            )),
        },
        other => Err(syn::Error::new_spanned(other, "a kernel parameter is `&[T]`, `&mut [T]` or a scalar")),
    }
}

/// A scalar or vector type name.
pub(crate) fn elem(ty: &syn::Type) -> syn::Result<Elem> {
    if let syn::Type::Path(p) = ty
        && let Some(id) = p.path.get_ident()
    {
        let name = id.to_string();
        if let Some(s) = Scalar::from_rust_name(&name) {
            return Ok(Elem::Scalar(s));
        }
        if let Some(v) = Vector::from_rust_name(&name) {
            return Ok(Elem::Vector(v));
        }
        let hint = match name.as_str() {
            "f64" => ": kernels compute in f32",
            "usize" | "isize" => ": use u32 (or u64 for byte offsets past 4 GiB)",
            "i8" | "i16" => ": narrow signed integers are not supported",
            _ => "",
        };
        return Err(syn::Error::new_spanned(id, format!("`{name}` is not a kernel type{hint}")));
    }
    Err(syn::Error::new_spanned(ty, "expected a type name such as f32, u32, bf16 or u32x4"))
}
