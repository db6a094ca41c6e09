//! Splitting what a stub sends into tokens: acks, packets (checked against their checksum)
//! and stray bytes. A pure function over the bytes: the connection, tests and fuzzing share it.

use super::{checksum, hex_digit};

/// One unit of what a stub sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token<'a> {
    /// `+`: the last packet arrived.
    Ack,
    /// `-`: the last packet arrived garbled; send it again.
    Nak,
    /// `$body#cs`, or `%body#cs` for a notification; `body` is still run-length encoded and
    /// escaped.
    Packet {
        notification: bool,
        body: &'a [u8],
        checksum_ok: bool,
    },
    /// Any other byte outside a packet.
    Noise(u8),
}

/// What [`scan`] found at the start of its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan<'a> {
    /// A token, and how many input bytes it took.
    Token(Token<'a>, usize),
    /// The input ends before the token does (or is empty).
    Incomplete,
    /// A packet body runs past the maximum without its `#`.
    TooLong,
}

/// Splits the first token off bytes received from a stub, accepting packet bodies of at most
/// `max_body` bytes. A pure function over the bytes: the connection, tests and fuzzing share it.
pub fn scan(input: &[u8], max_body: usize) -> Scan<'_> {
    let Some(&first) = input.first() else {
        return Scan::Incomplete;
    };
    let notification = match first {
        b'+' => return Scan::Token(Token::Ack, 1),
        b'-' => return Scan::Token(Token::Nak, 1),
        b'$' => false,
        b'%' => true,
        other => return Scan::Token(Token::Noise(other), 1),
    };
    let rest = &input[1..];
    let Some(hash) = rest
        .iter()
        .take(max_body.saturating_add(1))
        .position(|&b| b == b'#')
    else {
        return if rest.len() > max_body {
            Scan::TooLong
        } else {
            Scan::Incomplete
        };
    };
    let Some(&[c1, c2]) = rest.get(hash + 1..hash + 3) else {
        return Scan::Incomplete;
    };
    let body = &rest[..hash];
    let stated = hex_digit(c1).zip(hex_digit(c2)).map(|(h, l)| (h << 4) | l);
    Scan::Token(
        Token::Packet {
            notification,
            body,
            checksum_ok: stated == Some(checksum(body)),
        },
        hash + 4,
    )
}
