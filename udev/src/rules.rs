//! The udev rules a packaged install carries, built into the crate so that
//! packaging and `bcd doctor` use the same bytes as this repository's
//! `udev/rules/`.

/// Where a package installs them.
pub const INSTALL_DIR: &str = "/usr/lib/udev/rules.d";

/// One rules file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RulesFile {
    /// The file name under [`INSTALL_DIR`].
    pub name: &'static str,
    pub text: &'static str,
}

/// Every rules file, in the order udev reads them.
pub const FILES: &[RulesFile] = &[RulesFile {
    name: "60-bcd.rules",
    text: include_str!("../rules/60-bcd.rules"),
}];
