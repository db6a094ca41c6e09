//! stackscope's own lossless format: the serde form of [`Profile`] in an envelope that names
//! the format and its version, `{"format":"stackscope","version":1,"profile":{...}}`.

use super::{check_indices, ReadError};
use crate::Profile;
use serde::{Deserialize, Serialize};
use std::io::{self, Write};

const FORMAT: &str = "stackscope";
const VERSION: u64 = 1;

#[derive(Serialize)]
struct EnvelopeOut<'a> {
    format: &'a str,
    version: u64,
    profile: &'a Profile,
}

/// The envelope's head, read before the profile so an unknown version is reported as such
/// rather than as whatever schema mismatch it causes.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    format: Option<serde_json::Value>,
    #[serde(default)]
    version: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Body {
    profile: Profile,
}

pub(super) fn write(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    let envelope = EnvelopeOut {
        format: FORMAT,
        version: VERSION,
        profile,
    };
    // serde_json hands back the writer's own error as it was, so a closed pipe stays one.
    serde_json::to_writer(&mut *out, &envelope).map_err(io::Error::from)?;
    out.write_all(b"\n")
}

pub(super) fn read(text: &str) -> Result<Profile, ReadError> {
    let head: Head = serde_json::from_str(text).map_err(syntax_error)?;
    let at = |place: &str, problem: String| ReadError::Json {
        place: place.to_string(),
        problem,
    };
    match head.format {
        Some(serde_json::Value::String(f)) if f == FORMAT => {}
        Some(other) => {
            return Err(at(
                "format",
                format!("expected \"{FORMAT}\", found {other}; this is not a stackscope profile"),
            ))
        }
        None => {
            return Err(at(
                "format",
                format!("missing; expected \"{FORMAT}\", so this is not a stackscope profile"),
            ))
        }
    }
    match head.version {
        Some(serde_json::Value::Number(v)) if v.as_u64() == Some(VERSION) => {}
        Some(other) => {
            return Err(at(
                "version",
                format!(
                    "version {other} is not supported (this stackscope reads version {VERSION}); \
                     convert it with the stackscope that wrote it"
                ),
            ))
        }
        None => return Err(at("version", "missing".to_string())),
    }
    let body: Body = serde_json::from_str(text).map_err(syntax_error)?;
    check_indices(&body.profile).map_err(|bad| ReadError::Json {
        place: format!("profile.{}", bad.place),
        problem: bad.problem,
    })?;
    Ok(body.profile)
}

fn syntax_error(e: serde_json::Error) -> ReadError {
    let place = format!("line {} column {}", e.line(), e.column());
    let problem = if e.is_eof() {
        "the JSON ends early; the file is truncated".to_string()
    } else {
        // serde_json appends the position, which `place` already holds.
        let message = e.to_string();
        message
            .strip_suffix(&format!(" at {place}"))
            .unwrap_or(&message)
            .to_string()
    };
    ReadError::Json { place, problem }
}
