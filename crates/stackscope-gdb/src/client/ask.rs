//! Registers and memory of several threads in one batch: `Hg` only where the thread changes,
//! every packet sent at once, the replies decoded in order.

use super::{Client, Registers};
use crate::error::Error;
use crate::packet::Stream;

/// One thing to read, as a thread sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// The thread's registers (`g`).
    Registers(u64),
    /// Up to `len` bytes at `addr` as `thread` sees memory (`m`, or `x` where offered).
    Memory { thread: u64, addr: u64, len: usize },
}

impl Ask {
    fn thread(self) -> u64 {
        match self {
            Ask::Registers(thread) | Ask::Memory { thread, .. } => thread,
        }
    }
}

/// What came back for an [`Ask`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Registers(Registers),
    /// `None` where the stub could not read the memory (`E NN`).
    Memory(Option<Vec<u8>>),
}

impl<S: Stream> Client<S> {
    /// Reads everything `asks` names in one round trip, in their order: each thread is
    /// selected where it differs from the one before, so asks grouped by thread cost one
    /// `Hg` per thread.
    pub fn ask(&mut self, asks: &[Ask]) -> Result<Vec<Answer>, Error> {
        let result = self.ask_inner(asks);
        if result.is_err() {
            // Which `Hg` took effect is unknown.
            self.selected = None;
        }
        result
    }

    fn ask_inner(&mut self, asks: &[Ask]) -> Result<Vec<Answer>, Error> {
        let mut packets = Vec::with_capacity(asks.len() * 2);
        for &ask in asks {
            self.select_packet(ask.thread(), &mut packets);
            packets.push(match ask {
                Ask::Registers(_) => b"g".to_vec(),
                Ask::Memory { addr, len, .. } => self.memory_packet(addr, len),
            });
        }
        let replies = self.conn.exchange(&packets)?;
        let mut answers = Vec::with_capacity(asks.len());
        let mut asked = asks.iter();
        for (packet, reply) in packets.iter().zip(&replies) {
            if packet.starts_with(b"Hg") {
                self.expect_ok(packet, reply)?;
                continue;
            }
            let Some(&ask) = asked.next() else { break };
            answers.push(match ask {
                Ask::Registers(_) => Answer::Registers(self.registers_reply(packet, reply)?),
                Ask::Memory { len, .. } => Answer::Memory(self.memory_reply(packet, reply, len)?),
            });
        }
        Ok(answers)
    }
}
