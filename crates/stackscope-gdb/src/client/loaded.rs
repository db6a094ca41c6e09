//! Where the target's files are loaded: its auxiliary vector and shared-library list (read as
//! `qXfer` objects) and the text offset from `qOffsets`.

use std::path::PathBuf;

use super::{Client, MAX_LIBRARIES, MAX_LIBRARY_LIST, MAX_OBJECT};
use crate::error::Error;
use crate::packet::{unescape, Stream};

impl<S: Stream> Client<S> {
    /// The target's auxiliary vector (Linux programs under gdbserver), when the stub has one.
    pub fn auxv(&mut self) -> Result<Option<Vec<(u64, u64)>>, Error> {
        if !self.features.auxv {
            return Ok(None);
        }
        let data = self.read_object("auxv", "", MAX_OBJECT)?;
        Ok(Some(
            data.chunks_exact(16)
                .map(|p| {
                    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
                    (word(&p[..8]), word(&p[8..]))
                })
                .collect(),
        ))
    }

    /// The text offset from `qOffsets` (`Text=xxx;Data=xxx`), when the stub gives one.
    pub fn text_offset(&mut self) -> Result<Option<u64>, Error> {
        self.conn.send(b"qOffsets")?;
        let reply = self.conn.receive()?;
        if reply.is_empty() || reply.starts_with(b"E") {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(&reply).into_owned();
        let offset = text
            .split(';')
            .find_map(|f| {
                f.strip_prefix("Text=")
                    .or_else(|| f.strip_prefix("TextSeg="))
            })
            .and_then(|v| u64::from_str_radix(v, 16).ok());
        match offset {
            Some(o) => Ok(Some(o)),
            None => Err(self.conn.malformed(&reply, "expected Text=...")),
        }
    }

    /// The shared libraries the target has loaded, as (path, load bias), from the svr4 list;
    /// `None` when the stub does not give one (QEMU). A list of more than [`MAX_LIBRARY_LIST`]
    /// bytes or [`MAX_LIBRARIES`] libraries is an error.
    pub fn libraries(&mut self) -> Result<Option<Vec<(PathBuf, u64)>>, Error> {
        if !self.features.libraries_svr4 {
            return Ok(None);
        }
        let data = self.read_object("libraries-svr4", "", MAX_LIBRARY_LIST)?;
        let list = String::from_utf8_lossy(&data);
        if list.matches("<library ").count() > MAX_LIBRARIES {
            return Err(self
                .conn
                .excess(format!("listed more than {MAX_LIBRARIES} libraries")));
        }
        Ok(Some(parse_svr4(&list)))
    }

    /// Reads a whole `qXfer` object (`annex`: which one of its kind, as a file name) in
    /// packet-sized pieces, all due within one reply timeout; at most `max` bytes. Ctrl-C
    /// ([`Client::set_stop`]) ends it between two pieces.
    pub(super) fn read_object(
        &mut self,
        object: &str,
        annex: &str,
        max: usize,
    ) -> Result<Vec<u8>, Error> {
        let piece = self.features.packet_size.unwrap_or(4096).clamp(64, 65536) - 8;
        let deadline = self.conn.deadline();
        let mut data = Vec::new();
        loop {
            if self.stopped() {
                return Err(Error::Stopped {
                    peer: self.conn.peer().to_string(),
                    what: format!("{object} object"),
                });
            }
            let request = format!("qXfer:{object}:read:{annex}:{:x},{piece:x}", data.len());
            let reply = self.conn.request_by(request.as_bytes(), deadline)?;
            let (last, body) = match reply.split_first() {
                Some((b'l', body)) => (true, body),
                Some((b'm', body)) => (false, body),
                _ => {
                    return Err(self
                        .conn
                        .malformed(&reply, "expected m or l followed by data"))
                }
            };
            let bytes = unescape(body).ok_or_else(|| self.conn.malformed(&reply, "bad escape"))?;
            let empty = bytes.is_empty();
            data.extend_from_slice(&bytes);
            if data.len() > max {
                return Err(self.conn.excess(format!(
                    "sent a {object} object of more than {} MiB",
                    max >> 20
                )));
            }
            // An empty `m` would loop forever.
            if last || empty {
                return Ok(data);
            }
        }
    }
}

/// `<library name="/lib/x86_64-linux-gnu/libc.so.6" lm="0x..." l_addr="0x7ffff7dd5000" .../>`
/// elements of a `library-list-svr4` document, as (name, l_addr).
pub fn parse_svr4(xml: &str) -> Vec<(PathBuf, u64)> {
    xml.split("<library ")
        .skip(1)
        .filter_map(|element| {
            let element = &element[..element.find('>').unwrap_or(element.len())];
            let element = format!(" {element}");
            let name = attribute(&element, "name").filter(|n| !n.is_empty())?;
            let l_addr = attribute(&element, "l_addr")?;
            let l_addr = u64::from_str_radix(l_addr.trim_start_matches("0x"), 16).ok()?;
            Some((PathBuf::from(name), l_addr))
        })
        .collect()
}

/// The value of attribute `name` in the inside of an XML start tag that starts with a space,
/// its entities replaced.
pub(super) fn attribute(element: &str, name: &str) -> Option<String> {
    let start = element.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = element[start..].find('"')?;
    Some(
        element[start..start + len]
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&"),
    )
}
