//! The `Tiles` struct of a kernel and its `TileSet` impl: defaults, candidates, constraints.

use kernel_dsl::TileValue;
use kernel_dsl::ir::TileType;
use proc_macro2::TokenStream;
use quote::quote;

use crate::parse::kernel::KernelDecl;
use crate::parse::tiles::TileDecl;
use crate::paths;

fn value(v: TileValue) -> TokenStream {
    match v {
        TileValue::U32(n) => quote!(#n),
        TileValue::Bool(b) => quote!(#b),
    }
}

/// `let NAME: u32 = tiles.name;` for every tile, so host expressions read tiles by their names.
pub(crate) fn bind_tiles(decl: &KernelDecl, tiles: &TokenStream) -> TokenStream {
    let binds = decl.tiles.iter().map(|t| {
        let (name, field) = (&t.name, t.field());
        let ty = rust_type(t);
        quote!(let #name: #ty = #tiles.#field;)
    });
    quote!(#(#binds)*)
}

fn rust_type(t: &TileDecl) -> TokenStream {
    match t.ty {
        TileType::U32 => quote!(u32),
        TileType::Bool => quote!(bool),
    }
}

pub(crate) fn generate(decl: &KernelDecl) -> TokenStream {
    let dsl = paths::dsl();
    let launch = paths::launch();
    let kernel_name = decl.name.to_string();
    let fields = decl.tiles.iter().map(|t| {
        let (field, ty) = (t.field(), rust_type(t));
        let doc =
            format!("`{}`: candidates {:?}.", t.name, t.candidates.iter().map(ToString::to_string).collect::<Vec<_>>());
        quote!(#[doc = #doc] pub #field: #ty)
    });
    let defaults = decl.tiles.iter().map(|t| {
        let (field, v) = (t.field(), value(t.default));
        quote!(#field: #v)
    });
    let values = decl.tiles.iter().map(|t| {
        let (field, name) = (t.field(), t.name.to_string());
        let v = match t.ty {
            TileType::U32 => quote!(#dsl::TileValue::U32(self.#field)),
            TileType::Bool => quote!(#dsl::TileValue::Bool(self.#field)),
        };
        quote!((#name, #v))
    });
    // The cartesian product of the candidate lists, filtered by the tile constraints.
    let defaults_again: Vec<TokenStream> = decl
        .tiles
        .iter()
        .map(|t| {
            let f = t.field();
            quote!(#f)
        })
        .collect();
    let (t, out) = (paths::local("t"), paths::local("out"));
    let mut product = quote! {
        let #t = Tiles { #(#defaults_again),* };
        if #dsl::TileSet::check(&#t).is_ok() { #out.push(#t); }
    };
    for t in decl.tiles.iter().rev() {
        let f = t.field();
        let cands = t.candidates.iter().map(|v| value(*v));
        product = quote! { for #f in [#(#cands),*] { #product } };
    }
    let binds = bind_tiles(decl, &quote!(self));
    let checks = decl.launch.requires.iter().filter(|r| r.tiles_only).map(|r| {
        let expr = &r.expr;
        let text = quote!(#expr).to_string();
        quote! {
            if !(#expr) {
                return ::std::result::Result::Err(#launch::LaunchError {
                    kernel: #kernel_name,
                    message: ::std::format!("tiles {:?} break the requirement `{}`", self, #text),
                });
            }
        }
    });
    let threads = paths::local("threads");
    let block = &decl.launch.block;
    let block_text = quote!(#block).to_string();
    // `min_blocks`: its own method, and a check that that many blocks fit in an SM's threads.
    let (min_blocks_fn, min_blocks_check) = match &decl.launch.min_blocks {
        None => (quote!(), quote!()),
        Some(m) => {
            let text = quote!(#m).to_string();
            let blocks = paths::local("blocks");
            (
                quote! {
                    #[allow(non_snake_case, unused_variables)]
                    fn min_blocks(&self) -> u32 {
                        #binds
                        #m
                    }
                },
                quote! {
                    let #blocks: u32 = #m;
                    if #blocks.saturating_mul(#threads) > #dsl::Arch::MAX_THREADS_PER_SM {
                        return ::std::result::Result::Err(#launch::LaunchError {
                            kernel: #kernel_name,
                            message: ::std::format!("tiles {:?} ask for {} blocks of {} threads on one SM (`min_blocks = {}`); an SM holds {} threads", self, #blocks, #threads, #text, #dsl::Arch::MAX_THREADS_PER_SM),
                        });
                    }
                },
            )
        }
    };
    // `max_blocks`: its own method, and a check that it does not contradict `min_blocks`.
    let (max_blocks_fn, max_blocks_check) = match &decl.launch.max_blocks {
        None => (quote!(), quote!()),
        Some(m) => {
            let text = quote!(#m).to_string();
            let most = paths::local("most");
            let least = match &decl.launch.min_blocks {
                Some(min) => quote!(#min),
                None => quote!(0u32),
            };
            (
                quote! {
                    #[allow(non_snake_case, unused_variables)]
                    fn max_blocks(&self) -> u32 {
                        #binds
                        #m
                    }
                },
                quote! {
                    let #most: u32 = #m;
                    if #most > 0 && #most < #least {
                        return ::std::result::Result::Err(#launch::LaunchError {
                            kernel: #kernel_name,
                            message: ::std::format!("tiles {:?} allow at most {} blocks an SM (`max_blocks = {}`) but are compiled for {} (`min_blocks`)", self, #most, #text, #least),
                        });
                    }
                },
            )
        }
    };
    // The tiles marked `step`, by name.
    let in_step: Vec<String> = decl.tiles.iter().filter(|t| t.chosen_in_step).map(|t| t.name.to_string()).collect();
    let in_step = if in_step.is_empty() {
        quote!()
    } else {
        quote!(const CHOSEN_IN_STEP: &'static [&'static str] = &[#(#in_step),*];)
    };
    quote! {
        /// The tile parameters: compile-time shapes the emitter writes as constants.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub struct Tiles { #(#fields),* }

        impl #dsl::TileSet for Tiles {
            const DEFAULT: Self = Tiles { #(#defaults),* };

            #in_step

            fn values(&self) -> ::std::vec::Vec<(&'static str, #dsl::TileValue)> {
                ::std::vec![#(#values),*]
            }

            fn candidates() -> ::std::vec::Vec<Self> {
                let mut #out = ::std::vec::Vec::new();
                #product
                #out
            }

            #[allow(non_snake_case, unused_variables)]
            fn check(&self) -> ::std::result::Result<(), #launch::LaunchError> {
                #binds
                #(#checks)*
                let #threads: u32 = #block;
                if #threads == 0 || #threads % 32 != 0 || #threads > 1024 {
                    return ::std::result::Result::Err(#launch::LaunchError {
                        kernel: #kernel_name,
                        message: ::std::format!("tiles {:?} give {} threads per block (`{}`); a block is 32 to 1024 threads, whole warps", self, #threads, #block_text),
                    });
                }
                #min_blocks_check
                #max_blocks_check
                ::std::result::Result::Ok(())
            }

            #min_blocks_fn

            #max_blocks_fn

            #[allow(non_snake_case, unused_variables)]
            fn block_threads(&self) -> u32 {
                #binds
                #block
            }
        }
    }
}
