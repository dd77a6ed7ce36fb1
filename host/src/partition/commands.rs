//! What a supervisor tells a partition loop, and the loop's end of that channel. The loop looks
//! at its commands at batch boundaries (and while it waits between sessions), so a command never
//! splits a batch.

use std::sync::mpsc::{Receiver, Sender, TryRecvError};

use parking_lot::Mutex;

use super::SlotProgress;

/// A command to a partition loop.
#[derive(Debug)]
pub enum Command {
    /// Commit what is pending, then stop.
    Stop,
    /// Commit what is pending, stop, and answer with the offsets committed last: where the next
    /// owner resumes (a move's handoff).
    Drain(Sender<Vec<SlotProgress>>),
    /// Commit what is pending now and go on; answer with the offsets committed.
    Flush(Sender<Vec<SlotProgress>>),
    /// Another owner took over: stop at once and commit nothing more. A commit already in
    /// flight still ends (it cannot be called back); batches processed after it are dropped.
    Fence,
    /// Commit what is pending, then put the state and the input offsets back to those of a
    /// checkpoint (restored into a directory), commit that, and start a new session from there.
    Rewind(Box<Rewind>),
}

/// A rewind of a partition to a checkpoint ([`Command::Rewind`]).
#[derive(Debug)]
pub struct Rewind {
    /// The checkpoint's number.
    pub seq: u64,
    /// Where its files were restored: a database of the partition's stores, read-only here.
    pub dir: std::path::PathBuf,
    /// Its input offsets, `<topic>/<slot>` to the next offset.
    pub input_offsets: std::collections::BTreeMap<String, u64>,
    /// The answer: keys put back, or why it could not be done.
    pub reply: Sender<Result<u64, String>>,
}

/// What the loop must do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wants {
    /// Go on.
    Nothing,
    /// Commit what is pending, then answer.
    Flush,
    /// Commit what is pending, then stop.
    Stop,
    /// Stop without committing.
    Fence,
    /// Commit what is pending, then rewind.
    Rewind,
}

/// The loop's end of its command channel: the command being acted on, and the ones queued.
pub struct Inbox {
    rx: Mutex<Receiver<Command>>,
    current: Mutex<Option<Command>>,
}

impl Inbox {
    /// A channel: the sender for the supervisor, the inbox for the loop.
    pub fn channel() -> (Sender<Command>, Inbox) {
        let (tx, rx) = std::sync::mpsc::channel();
        let inbox = Inbox {
            rx: Mutex::new(rx),
            current: Mutex::new(None),
        };
        (tx, inbox)
    }

    /// What the command being acted on (or the next one queued) asks for. With every sender
    /// gone, nobody can stop the loop any more: it stops.
    pub fn wants(&self) -> Wants {
        let mut current = self.current.lock();
        if current.is_none() {
            match self.rx.lock().try_recv() {
                Ok(c) => *current = Some(c),
                Err(TryRecvError::Empty) => return Wants::Nothing,
                Err(TryRecvError::Disconnected) => return Wants::Stop,
            }
        }
        match current.as_ref() {
            None => Wants::Nothing,
            Some(Command::Flush(_)) => Wants::Flush,
            Some(Command::Stop | Command::Drain(_)) => Wants::Stop,
            Some(Command::Fence) => Wants::Fence,
            Some(Command::Rewind(_)) => Wants::Rewind,
        }
    }

    /// Takes the rewind being acted on, which the loop then answers itself.
    pub fn take_rewind(&self) -> Option<Box<Rewind>> {
        let mut current = self.current.lock();
        match current.take() {
            Some(Command::Rewind(r)) => Some(r),
            other => {
                *current = other;
                None
            }
        }
    }

    /// The command being acted on is done, with `committed` the offsets committed last.
    pub fn done(&self, committed: Vec<SlotProgress>) {
        match self.current.lock().take() {
            Some(Command::Drain(reply) | Command::Flush(reply)) => {
                // A caller that gave up waiting is gone; nothing to tell.
                let _ = reply.send(committed);
            }
            Some(Command::Rewind(r)) => {
                let _ = r.reply.send(Err("the partition stopped first".into()));
            }
            Some(Command::Stop | Command::Fence) | None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_taken_one_at_a_time_and_answered() {
        let (tx, inbox) = Inbox::channel();
        assert_eq!(inbox.wants(), Wants::Nothing);
        let (reply, answer) = std::sync::mpsc::channel();
        tx.send(Command::Flush(reply)).unwrap();
        tx.send(Command::Fence).unwrap();
        assert_eq!(inbox.wants(), Wants::Flush);
        // Still the flush until it is done.
        assert_eq!(inbox.wants(), Wants::Flush);
        let at = vec![SlotProgress {
            topic: "in".into(),
            slot: 0,
            offset: 7,
            end: 9,
        }];
        inbox.done(at.clone());
        assert_eq!(answer.recv().unwrap(), at);
        assert_eq!(inbox.wants(), Wants::Fence);
        inbox.done(Vec::new());
        assert_eq!(inbox.wants(), Wants::Nothing);
        drop(tx);
        assert_eq!(inbox.wants(), Wants::Stop, "no sender left: stop");
    }
}
