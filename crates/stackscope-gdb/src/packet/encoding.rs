//! The encodings inside a packet: the `$data#cs` frame with its escapes, the checksum,
//! run-length encoded replies, binary escapes, hex text and `E NN` error replies.

/// `$data#cs`, with the bytes that would end or confuse the framing escaped.
pub fn frame(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 4);
    out.push(b'$');
    for &b in data {
        if matches!(b, b'$' | b'#' | b'}' | b'*') {
            out.push(b'}');
            out.push(b ^ 0x20);
        } else {
            out.push(b);
        }
    }
    let cs = checksum(&out[1..]);
    out.push(b'#');
    out.extend_from_slice(format!("{cs:02x}").as_bytes());
    out
}

/// The modulo-256 sum of a packet's bytes between `$` and `#`.
pub fn checksum(body: &[u8]) -> u8 {
    body.iter().fold(0u8, |sum, &b| sum.wrapping_add(b))
}

/// Expands run-length encoding: `X*N` stands for `X` followed by `N - 29` more `X`s.
/// `None` when a `*` has no character before it, a count is out of range, or the result
/// would be longer than `max` bytes.
pub fn expand_runs(body: &[u8], max: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len().min(max));
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        if b == b'*' {
            let count = *body.get(i + 1)?;
            let &last = out.last()?;
            let repeat = usize::from(count).checked_sub(29).filter(|&n| n > 0)?;
            if out.len() + repeat > max {
                return None;
            }
            out.extend(std::iter::repeat_n(last, repeat));
            i += 2;
        } else {
            if out.len() >= max {
                return None;
            }
            out.push(b);
            i += 1;
        }
    }
    Some(out)
}

/// Undoes the binary escape (`}` then the byte xor 0x20) of binary replies (`x`, `qXfer`).
/// `None` when the data ends in a lone `}`.
pub fn unescape(data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len());
    let mut bytes = data.iter();
    while let Some(&b) = bytes.next() {
        if b == b'}' {
            out.push(bytes.next()? ^ 0x20);
        } else {
            out.push(b);
        }
    }
    Some(out)
}

/// `Some("NN")` for an `E NN` error reply.
pub fn error_code(reply: &[u8]) -> Option<String> {
    match reply {
        [b'E', a, b] if a.is_ascii_hexdigit() && b.is_ascii_hexdigit() => {
            Some(String::from_utf8_lossy(&reply[1..]).into_owned())
        }
        // Textual errors (`E.message`), from stubs that support them.
        [b'E', b'.', ..] => Some(String::from_utf8_lossy(&reply[2..]).into_owned()),
        _ => None,
    }
}

pub(crate) fn hex_digit(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Decodes hex text into bytes; `None` on an odd length or a non-hex digit.
pub fn decode_hex(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks_exact(2)
        .map(|p| Some((hex_digit(p[0])? << 4) | hex_digit(p[1])?))
        .collect()
}
