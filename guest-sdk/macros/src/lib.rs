//! The `#[processor]` attribute of `baton-sdk`.

use proc_macro::TokenStream;
use quote::quote;
use syn::parse::Parser;
use syn::{ItemFn, Path, parse_macro_input};

/// Turns `fn(&Message, &mut Context) -> Result<()>` into the exported handler of a baton
/// processor component. `#[processor(init = setup)]` also calls `fn setup(&Config) -> Result<()>`
/// once per instance before the first batch; `#[processor(on_timer = fire)]` calls
/// `fn fire(&Timer, &mut Context) -> Result<()>` for each timer that falls due.
#[proc_macro_attribute]
pub fn processor(attr: TokenStream, item: TokenStream) -> TokenStream {
    let func = parse_macro_input!(item as ItemFn);
    let mut init: Option<Path> = None;
    let mut on_timer: Option<Path> = None;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("init") {
            init = Some(meta.value()?.parse()?);
            Ok(())
        } else if meta.path.is_ident("on_timer") {
            on_timer = Some(meta.value()?.parse()?);
            Ok(())
        } else {
            Err(meta.error(
                "unknown argument; the arguments are `init = path::to::setup` and \
                 `on_timer = path::to::fire`",
            ))
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
    let fire = match on_timer {
        Some(path) => {
            quote!(Some(#path as fn(&::baton_sdk::Timer, &mut ::baton_sdk::Context) -> ::baton_sdk::Result<()>))
        }
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

            fn process(batch: ::baton_sdk::__private::Batch) -> ::baton_sdk::Result<()> {
                ::baton_sdk::__private::process(batch, #name)
            }

            fn on_timers(
                slot: u32,
                event_time: i64,
                fired: ::std::vec::Vec<::baton_sdk::__private::Fired>,
            ) -> ::baton_sdk::Result<()> {
                ::baton_sdk::__private::on_timers(slot, event_time, fired, #fire)
            }
        }

        ::baton_sdk::bindings::export!(__BatonProcessor);
    }
    .into()
}
