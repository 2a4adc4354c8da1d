//! Reporting: a macro error becomes `compile_error!` at the offending span, followed by the item
//! with the DSL's helper attributes stripped, so that the rest of the crate (and an IDE) still sees
//! a function and does not drown the real error in follow-on ones.

use proc_macro2::TokenStream;
use quote::ToTokens;

pub(crate) fn into_tokens(err: syn::Error, item: TokenStream) -> TokenStream {
    let mut out = err.to_compile_error();
    if let Ok(mut f) = syn::parse2::<syn::ItemFn>(item) {
        for input in &mut f.sig.inputs {
            if let syn::FnArg::Typed(pt) = input {
                pt.attrs.retain(|a| !a.path().is_ident("tile"));
            }
        }
        // The body is not Rust a host compiler accepts (intrinsics, DSL types): keep the signature.
        *f.block = syn::parse_quote!({ unimplemented!() });
        f.attrs.push(syn::parse_quote!(#[allow(unused, non_snake_case, clippy::all)]));
        // Type names such as bf16 are not in scope on the host either: replace the inputs.
        f.sig.inputs.clear();
        f.to_tokens(&mut out);
    }
    out
}
