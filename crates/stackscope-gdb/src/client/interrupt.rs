//! Stopping the target together with the first reads of a round.

use std::time::Instant;

use super::{Answer, Ask, Client, StopReply};
use crate::error::Error;
use crate::packet::Stream;

impl<S: Stream> Client<S> {
    /// Stops the running target and reads what `asks` names (see [`Client::ask`]). To a
    /// whole-machine stub (QEMU's) the interrupt and the requests go out in one write, so that stopping
    /// costs no round trip of its own: it stops every vCPU on the byte before it reads on. A
    /// process stub (one that lists libraries or an auxiliary vector: gdbserver) polls for the
    /// interrupt a byte at a time while the program runs and drops what is not one, so it
    /// gets the requests after its stop reply. A stop the target made on its own while
    /// running is returned the same way.
    pub fn interrupt_and_ask(&mut self, asks: &[Ask]) -> Result<(StopReply, Vec<Answer>), Error> {
        // The first interrupt goes alone: a stub that ignores it (QEMU's user-mode stub) is
        // told apart before anything is sent after it.
        if !self.interrupt_stops || self.features.auxv || self.features.libraries_svr4 {
            let stop = self.interrupt()?;
            return Ok((stop, self.ask(asks)?));
        }
        self.conn.lead_with(0x03);
        let start = Instant::now();
        let answers = self.ask(asks);
        // The stop reply came first: a target that ended, a stub that never stops it, or a
        // reply that is no stop, is the error to report, whatever became of the reads.
        let stop = self.stop_after_interrupt(start)?;
        Ok((stop, answers?))
    }
}
