//! Every path the generated code names starts here, so that no generate module spells a crate path.

use proc_macro2::TokenStream;
use quote::quote;

/// The root of the DSL crate as generated code names it.
pub(crate) fn dsl() -> TokenStream {
    quote!(::kernel_dsl)
}

pub(crate) fn ir() -> TokenStream {
    let dsl = dsl();
    quote!(#dsl::ir)
}

pub(crate) fn types() -> TokenStream {
    let dsl = dsl();
    quote!(#dsl::types)
}

pub(crate) fn launch() -> TokenStream {
    let dsl = dsl();
    quote!(#dsl::launch)
}
