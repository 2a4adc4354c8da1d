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

/// A name for the generated code's own locals and parameters. Mixed-site hygiene keeps it apart
/// from the kernel's names, so a parameter called `tiles` or a tile called `OUT` cannot clash.
pub(crate) fn local(name: &str) -> proc_macro2::Ident {
    proc_macro2::Ident::new(name, proc_macro2::Span::mixed_site())
}
