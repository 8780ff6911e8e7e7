//! Session names as they arrive from MQTT topics, serial frames or the console: untrusted text
//! that becomes a file name, so it is held to a small, safe alphabet.

use std::fmt;

/// Longest session name.
pub const MAX_ID_LEN: usize = 64;

/// A session's name: 1 to [`MAX_ID_LEN`] characters of `A-Z a-z 0-9 _ - .`, not starting with
/// `.` or `-`. So it is always one plain file name inside the state directory: no `/`, no `..`,
/// no hidden file, nothing a shell tool takes for an option, the same on every file system.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(String);

/// Why a session name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("session name is empty")]
    Empty,
    #[error("session name is {0} bytes long; at most {MAX_ID_LEN} are allowed")]
    TooLong(usize),
    #[error(
        "session name has {ch:?} at position {at}; allowed are A-Z a-z 0-9 _ - . (not first: . -)"
    )]
    BadChar { ch: char, at: usize },
}

impl SessionId {
    pub fn parse(s: &str) -> Result<SessionId, IdError> {
        if s.is_empty() {
            return Err(IdError::Empty);
        }
        if s.len() > MAX_ID_LEN {
            return Err(IdError::TooLong(s.len()));
        }
        for (at, ch) in s.chars().enumerate() {
            let ok = ch.is_ascii_alphanumeric() || matches!(ch, '_' | '-' | '.');
            if !ok || (at == 0 && matches!(ch, '.' | '-')) {
                return Err(IdError::BadChar { ch, at });
            }
        }
        Ok(SessionId(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for SessionId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<SessionId, IdError> {
        SessionId::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_names_are_accepted() {
        for s in [
            "plc-7",
            "nurse_station.3",
            "A",
            "x".repeat(MAX_ID_LEN).as_str(),
        ] {
            assert_eq!(SessionId::parse(s).unwrap().as_str(), s);
        }
    }

    #[test]
    fn names_that_could_escape_the_state_directory_are_refused() {
        let bad = [
            ("", IdError::Empty),
            ("..", IdError::BadChar { ch: '.', at: 0 }),
            ("../etc", IdError::BadChar { ch: '.', at: 0 }),
            ("a/b", IdError::BadChar { ch: '/', at: 1 }),
            ("a\\b", IdError::BadChar { ch: '\\', at: 1 }),
            (".hidden", IdError::BadChar { ch: '.', at: 0 }),
            ("-rf", IdError::BadChar { ch: '-', at: 0 }),
            ("a b", IdError::BadChar { ch: ' ', at: 1 }),
            ("nul\0", IdError::BadChar { ch: '\0', at: 3 }),
            ("café", IdError::BadChar { ch: 'é', at: 3 }),
        ];
        for (s, want) in bad {
            assert_eq!(SessionId::parse(s), Err(want), "{s:?}");
        }
        let long = "x".repeat(MAX_ID_LEN + 1);
        assert_eq!(
            SessionId::parse(&long),
            Err(IdError::TooLong(MAX_ID_LEN + 1))
        );
    }
}
