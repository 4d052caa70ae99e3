//! Columns that hold one of a closed set, read as the type they name.
//!
//! A command's kind and state are kept by name (`exec.run`, `running`).
//! A gateway can write those rows, and a newer release may write a name
//! this one does not know, so a row that names nothing known is not an
//! error that fails a whole listing: it reads as [`Named::Unknown`] with
//! the text it holds, and whoever reads it decides (the evidence of a
//! result calls a row of an unknown kind forged, and one of an unknown
//! state unfinished: no ending it rests on; a listing shows either as
//! unspecified).

use std::fmt;

use bcd_core::command::{Kind, ServerState};

/// A closed set kept by name.
pub trait ByName: Copy + Sized {
    /// The name the store keeps.
    fn name(self) -> &'static str;
    /// The value a name names; `None` for any other text.
    fn from_name(name: &str) -> Option<Self>;
}

impl ByName for Kind {
    fn name(self) -> &'static str {
        Kind::name(self)
    }
    fn from_name(name: &str) -> Option<Self> {
        Kind::parse(name)
    }
}

impl ByName for ServerState {
    fn name(self) -> &'static str {
        ServerState::name(self)
    }
    fn from_name(name: &str) -> Option<Self> {
        ServerState::parse(name)
    }
}

/// A column of a closed set, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named<T> {
    /// A value this build knows.
    Known(T),
    /// Text that names none of them, as it was stored.
    Unknown(String),
}

impl<T: ByName> Named<T> {
    /// Reads a stored name.
    pub fn read(text: String) -> Named<T> {
        match T::from_name(&text) {
            Some(v) => Named::Known(v),
            None => Named::Unknown(text),
        }
    }

    /// The value, if the column names one this build knows.
    pub fn known(&self) -> Option<T> {
        match self {
            Named::Known(v) => Some(*v),
            Named::Unknown(_) => None,
        }
    }

    /// The text the column holds.
    pub fn text(&self) -> &str {
        match self {
            Named::Known(v) => v.name(),
            Named::Unknown(s) => s,
        }
    }
}

impl<T: ByName> From<T> for Named<T> {
    fn from(v: T) -> Self {
        Named::Known(v)
    }
}

impl<T: ByName> fmt::Display for Named<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

impl<T: ByName> PartialEq<T> for Named<T>
where
    T: PartialEq,
{
    fn eq(&self, other: &T) -> bool {
        self.known().is_some_and(|v| v == *other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_name_reads_as_what_it_names_or_as_its_text() {
        for k in Kind::ALL {
            let n = Named::<Kind>::read(k.name().to_string());
            assert_eq!(n, Named::Known(k));
            assert_eq!(n.text(), k.name());
        }
        let odd = Named::<ServerState>::read("exec.ran".into());
        assert_eq!(odd, Named::Unknown("exec.ran".into()));
        assert_eq!(odd.known(), None);
        assert_eq!(odd.to_string(), "exec.ran");
        assert!(Named::<ServerState>::read("running".into()) == ServerState::Running);
        assert!(odd != ServerState::Running);
    }
}
