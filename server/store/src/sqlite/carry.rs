//! Arguments carried into a transaction on another thread.
//!
//! SQLite's transactions run off the async runtime (the writer thread, a
//! blocking task), so what an operation is given must be owned and sent
//! there, then lent to the body as the type the operation declares:
//! `&str` travels as a `String`, `&[T]` as a `Vec<T>`, `&T` as a clone;
//! small values are copied, and a value that moves in (a sealing closure)
//! travels once.

use std::time::Duration;

use crate::bindings::VerifySignature;

/// An operation's argument as SQLite's transactions carry it.
pub(super) trait Carry<'a>: Sized {
    /// What travels to the transaction's thread.
    type Owned: Send + 'static;
    /// Makes the argument owned.
    fn own(self) -> Self::Owned;
    /// The argument again, as the operation declares it.
    fn back(owned: &'a mut Self::Owned) -> Self;
}

impl<'a> Carry<'a> for &'a str {
    type Owned = String;
    fn own(self) -> String {
        self.to_owned()
    }
    fn back(owned: &'a mut String) -> Self {
        owned
    }
}

impl<'a, T: Clone + Send + 'static> Carry<'a> for &'a [T] {
    type Owned = Vec<T>;
    fn own(self) -> Vec<T> {
        self.to_vec()
    }
    fn back(owned: &'a mut Vec<T>) -> Self {
        owned
    }
}

impl<'a, T: Clone + Send + 'static> Carry<'a> for &'a T {
    type Owned = T;
    fn own(self) -> T {
        self.clone()
    }
    fn back(owned: &'a mut T) -> Self {
        owned
    }
}

impl<'a> Carry<'a> for Option<&'a str> {
    type Owned = Option<String>;
    fn own(self) -> Option<String> {
        self.map(str::to_owned)
    }
    fn back(owned: &'a mut Option<String>) -> Self {
        owned.as_deref()
    }
}

impl<'a, T: Clone + Send + 'static> Carry<'a> for Option<&'a T> {
    type Owned = Option<T>;
    fn own(self) -> Option<T> {
        self.cloned()
    }
    fn back(owned: &'a mut Option<T>) -> Self {
        owned.as_ref()
    }
}

/// Small values, copied.
macro_rules! copied {
    ($($t:ty),* $(,)?) => {$(
        impl Carry<'_> for $t {
            type Owned = $t;
            fn own(self) -> $t {
                self
            }
            fn back(owned: &mut $t) -> $t {
                *owned
            }
        }
    )*};
}

copied!(
    bool,
    u32,
    u64,
    usize,
    i64,
    Option<i64>,
    Duration,
    VerifySignature,
    crate::rollouts::RolloutState,
    crate::rollouts::RolloutCommand,
    crate::reconcile::HistoryLimits,
    crate::secrets::Put,
    crate::id::ReleaseSeq,
    bcd_core::report::InventorySection,
);

/// Values that move in (the closures that seal, issue or judge): taken
/// by the body, which runs once.
macro_rules! moved {
    ($($t:ty),* $(,)?) => {$(
        impl Carry<'_> for $t {
            type Owned = Option<$t>;
            fn own(self) -> Option<$t> {
                Some(self)
            }
            fn back(owned: &mut Option<$t>) -> $t {
                owned.take().expect("a transaction's body runs once")
            }
        }
    )*};
}

moved!(
    crate::specs::ChangeSpec,
    crate::specs::OpenSpec,
    crate::specs::SealSpec,
    crate::tokens::IssueCert,
    crate::tokens::SealRevocation,
    crate::nodes::RenewCert,
    crate::nodes::SealStatement,
    crate::commands::SealCommand,
    crate::machines::ProvesMachine,
    crate::secrets::SealSecret,
);
