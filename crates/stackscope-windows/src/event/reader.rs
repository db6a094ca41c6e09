//! Reading an event's payload field by field, as the kernel's MOF classes lay it out: fixed
//! fields packed without padding, pointers of the logging kernel's width, strings ended by a
//! NUL.

use super::DecodeError;

pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    pointer_size: usize,
    /// The event's name, for the error when the payload ends early.
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8], pointer_size: usize, what: &'static str) -> Self {
        Reader {
            bytes,
            pos: 0,
            pointer_size,
            what,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(DecodeError::Short {
                event: self.what,
                len: self.bytes.len(),
            });
        };
        let field = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(field)
    }

    pub(super) fn skip(&mut self, n: usize) -> Result<(), DecodeError> {
        self.take(n).map(|_| ())
    }

    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub(super) fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(super) fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    /// A pointer-sized field (addresses, sizes).
    pub(super) fn pointer(&mut self) -> Result<u64, DecodeError> {
        match self.pointer_size {
            4 => self.u32().map(u64::from),
            _ => self.u64(),
        }
    }

    /// Pointers up to the end of the payload (a stack's frames).
    pub(super) fn pointers(&mut self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.remaining() / self.pointer_size);
        while let Ok(p) = self.pointer() {
            out.push(p);
        }
        out
    }

    pub(super) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// A NUL-terminated UTF-16 string; one cut short by the payload's end is taken as it is.
    pub(super) fn utf16(&mut self) -> String {
        let mut units = Vec::new();
        while let Ok(b) = self.take(2) {
            let unit = u16::from_le_bytes([b[0], b[1]]);
            if unit == 0 {
                break;
            }
            units.push(unit);
        }
        String::from_utf16_lossy(&units)
    }

    /// A NUL-terminated 8-bit string (the process image name).
    pub(super) fn ansi(&mut self) -> String {
        let rest = &self.bytes[self.pos..];
        let len = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        self.pos += (len + 1).min(rest.len());
        String::from_utf8_lossy(&rest[..len]).into_owned()
    }

    /// A user SID as kernel events carry it: 4 zero bytes when there is none, else a
    /// TOKEN_USER (two pointers) followed by the SID itself, whose length its sub-authority
    /// count gives.
    pub(super) fn skip_sid(&mut self) -> Result<(), DecodeError> {
        let start = self.pos;
        if self.u32()? == 0 {
            return Ok(());
        }
        self.pos = start;
        self.skip(2 * self.pointer_size)?;
        let _revision = self.u8()?;
        let sub_authorities = usize::from(self.u8()?);
        self.skip(6 + 4 * sub_authorities)
    }
}
