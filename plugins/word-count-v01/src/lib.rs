//! word-count as a component of the contract `baton:processor@0.1.0`, built with wit-bindgen and
//! no SDK: what a component built before 0.2 looks like. The host must keep running it
//! unchanged, over the same state as the 0.2 word-count.

wit_bindgen::generate!({ world: "processor", path: "../../wit/v0.1" });

use baton::processor::state::Store;
use baton::processor::types::{Error, Message};
use exports::baton::processor::handler::Guest;

struct WordCount;

impl Guest for WordCount {
    fn init(_config: Vec<(String, String)>) -> Result<(), Error> {
        Ok(())
    }

    /// Adds one to the count of each record's key in the store `counts`.
    fn process(batch: Vec<Message>) -> Result<(), Error> {
        let counts = Store::open("counts")?;
        for msg in &batch {
            if let Some(key) = &msg.key {
                counts.increment(key, 1)?;
            }
        }
        Ok(())
    }
}

export!(WordCount);
