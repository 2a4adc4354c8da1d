//! The module a `#[kernel]` function becomes: `Tiles`, `Args`, `Kernel` (its `KernelDef`) and
//! `ERASED`.

use proc_macro2::TokenStream;
use quote::quote;

use super::body::Rebuild;
use crate::parse::kernel::KernelDecl;
use crate::paths;

pub(crate) fn generate(decl: &KernelDecl) -> TokenStream {
    let dsl = paths::dsl();
    let ir = paths::ir();
    let launch = paths::launch();
    let (vis, name) = (&decl.vis, &decl.name);
    let name_str = name.to_string();
    let doc_attrs = decl.doc.iter().map(|l| {
        let l = format!(" {l}");
        quote!(#[doc = #l])
    });
    let doc_lines = decl.doc.iter().map(|l| quote!(::std::string::String::from(#l)));
    let tiles_ir = decl.tiles.iter().map(|t| {
        let n = t.name.to_string();
        let ty = t.ty.rebuild();
        quote!(#ir::TileParam { name: ::std::string::String::from(#n), ty: #ty })
    });
    let params_ir = decl.ir_params.iter().map(Rebuild::rebuild).collect::<Vec<_>>();
    let body_ir = decl.body.iter().map(Rebuild::rebuild);
    let tiles = super::tiles::generate(decl);
    let args = super::launch::generate_args(decl);
    let launch_dims = super::launch::generate_launch_dims(decl);
    let (tiles_arg, args_arg) = (paths::local("tiles"), paths::local("args"));
    let cooperative = decl.launch.cooperative;
    // The helpers files' bytes, unused: so that cargo rebuilds this kernel when one changes
    // (the macro read it; rustc does not know that).
    let helpers_files = decl.launch.helpers.iter().map(|path| {
        let path = path.value();
        quote!(
            const _: &[u8] = ::core::include_bytes!(::core::concat!(::core::env!("CARGO_MANIFEST_DIR"), "/", #path));
        )
    });
    quote! {
        #(#doc_attrs)*
        #[allow(non_snake_case, non_camel_case_types, clippy::all)]
        #vis mod #name {
            #[allow(unused_imports)]
            use #launch::div_ceil;

            #(#helpers_files)*

            #tiles

            #args

            /// The kernel: template, tiles, arguments, launch geometry.
            #[derive(Clone, Copy, Debug, Default)]
            pub struct Kernel;

            impl #dsl::KernelDef for Kernel {
                const NAME: &'static str = #name_str;
                type Tiles = Tiles;
                type Args = Args;

                fn template() -> &'static #ir::KernelTemplate {
                    static TEMPLATE: ::std::sync::OnceLock<#ir::KernelTemplate> = ::std::sync::OnceLock::new();
                    TEMPLATE.get_or_init(|| #ir::KernelTemplate {
                        name: ::std::string::String::from(#name_str),
                        origin: ::std::string::String::from(::core::file!()),
                        doc: ::std::vec![#(#doc_lines),*],
                        tiles: ::std::vec![#(#tiles_ir),*],
                        params: ::std::vec![#(#params_ir),*],
                        body: ::std::vec![#(#body_ir),*],
                        cooperative: #cooperative,
                    })
                }

                #[allow(non_snake_case, unused_variables)]
                fn launch_dims(#tiles_arg: &Tiles, #args_arg: &Args) -> ::std::result::Result<#launch::LaunchDims, #launch::LaunchError> {
                    #launch_dims
                }
            }

            /// The kernel seen without its types, for tools that walk every kernel.
            pub static ERASED: #launch::Erased<Kernel> = #launch::Erased::new();
        }
    }
}
