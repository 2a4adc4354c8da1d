//! The `Args` struct of a kernel (its parameters as device pointers and scalars) and the launch
//! geometry: grid and block from tiles and arguments, after the shape requirements.

use kernel_dsl::types::{Elem, Scalar, Type};
use proc_macro2::TokenStream;
use quote::{format_ident, quote};

use crate::parse::kernel::KernelDecl;
use crate::paths;

/// The host type that stands for a kernel element type.
fn host_type(e: Elem) -> TokenStream {
    let dsl = paths::dsl();
    match e {
        Elem::Scalar(Scalar::Bf16) => quote!(#dsl::elem::bf16),
        Elem::Scalar(Scalar::F16) => quote!(#dsl::elem::f16),
        Elem::Scalar(Scalar::E4m3) => quote!(#dsl::elem::e4m3),
        Elem::Scalar(Scalar::E2m1x2) => quote!(#dsl::elem::e2m1x2),
        Elem::Scalar(s) => {
            let id = format_ident!("{}", s.rust_name());
            quote!(#id)
        }
        // A vector buffer is, on the host, a buffer of its lanes' bits.
        Elem::Vector(v) => {
            let id = format_ident!("{}", v.lane().rust_name());
            let lanes = usize::from(v.lanes());
            quote!([#id; #lanes])
        }
    }
}

fn field_type(ty: Type) -> TokenStream {
    let launch = paths::launch();
    match ty {
        Type::Ptr { elem, mutable: false } => {
            let h = host_type(elem);
            quote!(#launch::DevPtr<#h>)
        }
        Type::Ptr { elem, mutable: true } => {
            let h = host_type(elem);
            quote!(#launch::DevPtrMut<#h>)
        }
        Type::Scalar(s) => host_type(Elem::Scalar(s)),
        // #[kernel] admits only pointers and scalars as parameters.
        _ => quote!(()),
    }
}

pub(crate) fn generate_args(decl: &KernelDecl) -> TokenStream {
    let launch = paths::launch();
    let fields = decl.params.iter().map(|p| {
        let (name, ty) = (&p.name, field_type(p.ty));
        let doc = format!("`{}: {}`", p.name, p.ty);
        quote!(#[doc = #doc] pub #name: #ty)
    });
    let params = decl.params.iter().map(|p| {
        let name = &p.name;
        quote!(#launch::IntoParam::into_param(self.#name))
    });
    quote! {
        /// The kernel's parameters, in order: device buffers as typed addresses, scalars by value.
        #[derive(Clone, Copy, Debug)]
        pub struct Args { #(#fields),* }

        impl #launch::KernelArgs for Args {
            fn params(&self) -> ::std::vec::Vec<#launch::ParamValue> {
                ::std::vec![#(#params),*]
            }
        }
    }
}

/// The body of `KernelDef::launch_dims`.
pub(crate) fn generate_launch_dims(decl: &KernelDecl) -> TokenStream {
    let launch = paths::launch();
    let kernel_name = decl.name.to_string();
    let (tiles, args, grid) = (paths::local("tiles"), paths::local("args"), paths::local("grid"));
    let tile_binds = super::tiles::bind_tiles(decl, &quote!(#tiles));
    let scalar_binds = decl.params.iter().filter(|p| matches!(p.ty, Type::Scalar(_))).map(|p| {
        let name = &p.name;
        quote!(let #name = #args.#name;)
    });
    let checks = decl.launch.requires.iter().filter(|r| !r.tiles_only).map(|r| {
        let expr = &r.expr;
        let text = quote!(#expr).to_string();
        let names = &r.names;
        let fmt = names.iter().map(|n| format!("{n} = {{}}")).collect::<Vec<_>>().join(", ");
        quote! {
            if !(#expr) {
                return ::std::result::Result::Err(#launch::LaunchError {
                    kernel: #kernel_name,
                    message: ::std::format!(
                        "the arguments break the requirement `{}` ({})",
                        #text,
                        ::std::format!(#fmt, #(#names),*)
                    ),
                });
            }
        }
    });
    let mut grid_dims: Vec<TokenStream> = decl.launch.grid.iter().map(|g| quote!(#g)).collect();
    while grid_dims.len() < 3 {
        grid_dims.push(quote!(1u32));
    }
    let cooperative = decl.launch.cooperative;
    quote! {
        <Tiles as #launch::TileSet>::check(#tiles)?;
        #tile_binds
        #(#scalar_binds)*
        #(#checks)*
        let #grid: [u32; 3] = [#(#grid_dims),*];
        if #grid.iter().any(|&g| g == 0) {
            return ::std::result::Result::Err(#launch::LaunchError {
                kernel: #kernel_name,
                message: ::std::format!("an empty grid {:?}: nothing to do for these arguments", #grid),
            });
        }
        ::std::result::Result::Ok(#launch::LaunchDims {
            grid: #grid,
            block: [<Tiles as #launch::TileSet>::block_threads(#tiles), 1, 1],
            dynamic_shared_bytes: 0,
            cooperative: #cooperative,
        })
    }
}
