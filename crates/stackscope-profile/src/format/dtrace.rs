//! Placeholder: being written.

use crate::Profile;
use std::io::{self, Write};

use super::WriteOptions;

pub fn write(_profile: &Profile, _opts: &WriteOptions, _out: &mut dyn Write) -> io::Result<()> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "not written yet"))
}
