//! uppercase as a component of the contract `baton:processor@0.1.0`, built with wit-bindgen and
//! no SDK: sends each record's value in upper case, with its key and headers, to the topic named
//! by `config.output`.

wit_bindgen::generate!({ world: "processor", path: "../../wit/v0.1" });

use std::cell::RefCell;

use baton::processor::output::send;
use baton::processor::types::{Error, Message};
use exports::baton::processor::handler::Guest;

thread_local! {
    static OUTPUT: RefCell<String> = const { RefCell::new(String::new()) };
}

struct Uppercase;

impl Guest for Uppercase {
    fn init(config: Vec<(String, String)>) -> Result<(), Error> {
        let Some((_, topic)) = config.into_iter().find(|(k, _)| k == "output") else {
            return Err(Error::InvalidInput(
                "config key `output` is required".into(),
            ));
        };
        OUTPUT.with(|o| *o.borrow_mut() = topic);
        Ok(())
    }

    fn process(batch: Vec<Message>) -> Result<(), Error> {
        let topic = OUTPUT.with(|o| o.borrow().clone());
        for msg in &batch {
            let value = msg
                .value
                .as_ref()
                .map(|v| String::from_utf8_lossy(v).to_uppercase().into_bytes());
            send(&topic, msg.key.as_deref(), value.as_deref(), &msg.headers)?;
        }
        Ok(())
    }
}

export!(Uppercase);
