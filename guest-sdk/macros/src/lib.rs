//! The `#[processor]` attribute of `baton-sdk`.

use proc_macro::TokenStream;
use quote::quote;
use syn::parse::Parser;
use syn::{ItemFn, Path, parse_macro_input};

/// Turns `fn(&Message, &mut Context) -> Result<()>` into the exported handler of a baton
/// processor component. `#[processor(init = setup)]` also calls `fn setup(&Config) -> Result<()>`
/// once per instance before the first batch.
#[proc_macro_attribute]
pub fn processor(attr: TokenStream, item: TokenStream) -> TokenStream {
    let func = parse_macro_input!(item as ItemFn);
    let mut init: Option<Path> = None;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("init") {
            init = Some(meta.value()?.parse()?);
            Ok(())
        } else {
            Err(meta.error("unknown argument; the only one is `init = path::to::setup`"))
        }
    });
    if let Err(e) = parser.parse(attr) {
        return e.to_compile_error().into();
    }
    if func.sig.inputs.len() != 2 {
        return syn::Error::new_spanned(
            &func.sig,
            "a processor takes two arguments: (msg: &Message, ctx: &mut Context)",
        )
        .to_compile_error()
        .into();
    }
    let name = &func.sig.ident;
    let setup = match init {
        Some(path) => quote!(Some(#path as fn(&::baton_sdk::Config) -> ::baton_sdk::Result<()>)),
        None => quote!(None),
    };
    quote! {
        #func

        #[doc(hidden)]
        struct __BatonProcessor;

        impl ::baton_sdk::__private::Guest for __BatonProcessor {
            fn init(config: ::std::vec::Vec<(::std::string::String, ::std::string::String)>) -> ::baton_sdk::Result<()> {
                ::baton_sdk::__private::init(config, #setup)
            }

            fn process(batch: ::std::vec::Vec<::baton_sdk::Message>) -> ::baton_sdk::Result<()> {
                ::baton_sdk::__private::process(batch, #name)
            }
        }

        ::baton_sdk::bindings::export!(__BatonProcessor);
    }
    .into()
}
