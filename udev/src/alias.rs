//! `modules.alias`: which modules drive a device, by its modalias.
//!
//! `depmod` collects every module's `MODULE_DEVICE_TABLE` into
//! `/lib/modules/<kver>/modules.alias`, one `alias PATTERN MODULE` line
//! each (`alias pci:v00001AF4d*sv*sd*bc*sc*i* virtio_pci`). A device's
//! modalias (sysfs `modalias`, uevent `MODALIAS`) names the modules whose
//! patterns match it. This module answers as `modprobe` does
//! (`modprobe -R MODALIAS`, which the tests use as the oracle):
//!
//! - patterns are shell wildcards as `fnmatch(3)` reads them with no flags:
//!   `*` (any run, `/` included), `?`, brackets with ranges, negation
//!   (`!` or `^`) and `[:classes:]`, and `\` quoting the next character;
//! - pattern and modalias are compared with `-` read as `_` outside
//!   brackets, as kmod normalizes both;
//! - every matching module counts, each once, in file order.
//!
//! `modules.alias.bin` is not read: the text is what depmod writes it from.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use initramfs::modules::module_name;

/// Why `modules.alias` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AliasError {
    #[error(
        "no modules.alias in {dir}: generate it with depmod -b ROOT KVER, and carry it in the \
         image next to modules.dep"
    )]
    Missing { dir: PathBuf },
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "line {line} of modules.alias is not \"alias PATTERN MODULE\": {text:?}; regenerate it \
         with depmod"
    )]
    Parse { line: usize, text: String },
    #[error("kernel version {0:?} is not a directory name under /lib/modules")]
    BadKernelVersion(String),
}

/// One `alias` line, normalized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    /// The pattern with `-` as `_` outside brackets.
    pub pattern: String,
    /// The module's name with `-` as `_`.
    pub module: String,
}

/// A parsed `modules.alias`, indexed by each pattern's literal prefix.
#[derive(Debug, Clone, Default)]
pub struct Aliases {
    entries: Vec<Alias>,
    /// Literal prefix (the pattern up to its first wildcard or quote) to
    /// the entries with that prefix, in file order.
    by_prefix: HashMap<String, Vec<usize>>,
}

impl Aliases {
    /// Reads `/lib/modules/<kver>/modules.alias` under `root`.
    pub fn open(root: &Path, kver: &str) -> Result<Aliases, AliasError> {
        if kver.is_empty() || kver == "." || kver == ".." || kver.contains(['/', '\0']) {
            return Err(AliasError::BadKernelVersion(kver.to_owned()));
        }
        let dir = root.join("lib/modules").join(kver);
        let path = dir.join("modules.alias");
        match fs::read(&path) {
            Ok(bytes) => Aliases::parse(&String::from_utf8_lossy(&bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(AliasError::Missing { dir }),
            Err(source) => Err(AliasError::Read { path, source }),
        }
    }

    /// Parses the text of `modules.alias`: `alias PATTERN MODULE` lines,
    /// blank lines and `#` comments. A pattern whose `[` is never closed
    /// is left out, as kmod leaves it out of its index.
    pub fn parse(text: &str) -> Result<Aliases, AliasError> {
        let mut entries = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let mut fields = trimmed.split_whitespace();
            let (Some("alias"), Some(pattern), Some(module), None) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                return Err(AliasError::Parse {
                    line: index + 1,
                    text: line.to_owned(),
                });
            };
            if let Some(pattern) = normalize(pattern) {
                entries.push(Alias {
                    pattern,
                    module: module_name(module),
                });
            }
        }
        Ok(Aliases::from_entries(entries))
    }

    fn from_entries(entries: Vec<Alias>) -> Aliases {
        let mut by_prefix: HashMap<String, Vec<usize>> = HashMap::new();
        for (index, alias) in entries.iter().enumerate() {
            by_prefix
                .entry(literal_prefix(&alias.pattern).to_owned())
                .or_default()
                .push(index);
        }
        Aliases { entries, by_prefix }
    }

    /// Every alias, in file order.
    pub fn iter(&self) -> impl Iterator<Item = &Alias> {
        self.entries.iter()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The modules whose patterns match `modalias`, each once, in file
    /// order. Empty when none does (or the modalias holds an unclosed `[`,
    /// which kmod refuses).
    pub fn modules_for(&self, modalias: &str) -> Vec<&str> {
        let Some(query) = normalize(modalias) else {
            return Vec::new();
        };
        let mut candidates: Vec<usize> = query
            .char_indices()
            .map(|(at, _)| at)
            .chain([query.len()])
            .filter_map(|end| self.by_prefix.get(&query[..end]))
            .flatten()
            .copied()
            .collect();
        candidates.sort_unstable();
        let mut out: Vec<&str> = Vec::new();
        for index in candidates {
            let alias = &self.entries[index];
            if !out.contains(&alias.module.as_str()) && fnmatch(&alias.pattern, &query) {
                out.push(&alias.module);
            }
        }
        out
    }

    /// Keeps the aliases `keep` accepts: an image carries the lines of the
    /// modules it carries.
    pub fn retain(&mut self, keep: impl FnMut(&Alias) -> bool) {
        let mut entries = std::mem::take(&mut self.entries);
        entries.retain(keep);
        *self = Aliases::from_entries(entries);
    }

    /// The text of a `modules.alias` with these aliases, normalized.
    pub fn to_text(&self) -> String {
        self.entries
            .iter()
            .map(|a| format!("alias {} {}\n", a.pattern, a.module))
            .collect()
    }
}

/// `-` as `_` outside brackets, as kmod's `alias_normalize`; `None` for an
/// unclosed `[`.
fn normalize(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '[' => {
                out.push('[');
                loop {
                    let c = chars.next()?;
                    out.push(c);
                    if c == ']' {
                        break;
                    }
                }
            }
            '-' => out.push('_'),
            c => out.push(c),
        }
    }
    Some(out)
}

/// The pattern up to its first `*`, `?`, `[` or `\`.
fn literal_prefix(pattern: &str) -> &str {
    let end = pattern.find(['*', '?', '[', '\\']).unwrap_or(pattern.len());
    &pattern[..end]
}

/// Whether `text` matches the shell `pattern` as `fnmatch(pattern, text,
/// 0)` decides: no special meaning for `/` or a leading `.`; `\` quotes.
///
/// Every token other than `*` matches exactly one character, so on a
/// mismatch only the last `*` needs to take one more character: the match
/// runs in time proportional to the product of the lengths at worst,
/// whatever the pattern.
pub fn fnmatch(pattern: &str, text: &str) -> bool {
    let p = pattern.as_bytes();
    let s = text.as_bytes();
    let (mut pi, mut si) = (0, 0);
    // Where to resume after the last `*`: its pattern position and the
    // text position it has consumed up to.
    let mut star: Option<(usize, usize)> = None;
    loop {
        if pi < p.len() {
            if p[pi] == b'*' {
                pi += 1;
                star = Some((pi, si));
                continue;
            }
            if si < s.len()
                && let Some(next) = match_one(p, pi, s[si])
            {
                pi = next;
                si += 1;
                continue;
            }
        } else if si == s.len() {
            return true;
        }
        match star {
            Some((after, consumed)) if consumed < s.len() => {
                star = Some((after, consumed + 1));
                pi = after;
                si = consumed + 1;
            }
            _ => return false,
        }
    }
}

/// If the token at `p[at]` (not `*`) matches `c`, the position after it.
fn match_one(p: &[u8], at: usize, c: u8) -> Option<usize> {
    match p[at] {
        b'?' => Some(at + 1),
        // A trailing `\` matches nothing, as in glibc.
        b'\\' => (*p.get(at + 1)? == c).then_some(at + 2),
        b'[' => match bracket(p, at, c) {
            Bracket::Closed { found, next } => found.then_some(next),
            Bracket::Invalid => None,
            // Unclosed: a literal `[`.
            Bracket::Unclosed => (c == b'[').then_some(at + 1),
        },
        literal => (literal == c).then_some(at + 1),
    }
}

/// A bracket expression, read.
enum Bracket {
    /// Whether the character is in it, and the position after its `]`.
    Closed { found: bool, next: usize },
    /// No `]` closes it: the `[` is a literal.
    Unclosed,
    /// It names an unknown `[:class:]`: glibc fails the whole match.
    Invalid,
}

/// Reads the bracket expression opening at `p[at]` and tests `c`.
fn bracket(p: &[u8], at: usize, c: u8) -> Bracket {
    let mut i = at + 1;
    let negate = matches!(p.get(i), Some(b'!' | b'^'));
    if negate {
        i += 1;
    }
    let mut found = false;
    let mut first = true;
    loop {
        let Some(&(mut lo)) = p.get(i) else {
            return Bracket::Unclosed;
        };
        if lo == b']' && !first {
            return Bracket::Closed {
                found: found != negate,
                next: i + 1,
            };
        }
        first = false;
        // `[:name:]`, where glibc takes only letters `a` to `y` (sic: its
        // test is `c < 'a' || c >= 'z'`) as a name; anything else makes
        // the `[` an ordinary member.
        if lo == b'[' && p.get(i + 1) == Some(&b':') {
            let name_end = p[i + 2..]
                .iter()
                .position(|&b| !(b'a'..=b'y').contains(&b))
                .map_or(p.len(), |n| i + 2 + n);
            if p[name_end..].starts_with(b":]") {
                match in_class(&p[i + 2..name_end], c) {
                    Some(inside) => found |= inside,
                    // glibc fails an unknown class when it gets to it, that
                    // is, unless an earlier member matched.
                    None if !found => return Bracket::Invalid,
                    None => {}
                }
                i = name_end + 2;
                continue;
            }
        }
        if lo == b'\\' {
            i += 1;
            let Some(&quoted) = p.get(i) else {
                return Bracket::Unclosed;
            };
            lo = quoted;
        }
        i += 1;
        // A range, unless the `-` is last before `]`.
        if p.get(i) == Some(&b'-') && p.get(i + 1).is_some_and(|&b| b != b']') {
            let mut hi = p[i + 1];
            i += 2;
            if hi == b'\\' {
                let Some(&quoted) = p.get(i) else {
                    return Bracket::Unclosed;
                };
                hi = quoted;
                i += 1;
            }
            found |= lo <= c && c <= hi;
        } else {
            found |= lo == c;
        }
    }
}

/// Whether `c` is in the POSIX class `name`; `None` for an unknown class.
fn in_class(name: &[u8], c: u8) -> Option<bool> {
    Some(match name {
        b"alnum" => c.is_ascii_alphanumeric(),
        b"alpha" => c.is_ascii_alphabetic(),
        b"blank" => c == b' ' || c == b'\t',
        b"cntrl" => c.is_ascii_control(),
        b"digit" => c.is_ascii_digit(),
        b"graph" => c.is_ascii_graphic(),
        b"lower" => c.is_ascii_lowercase(),
        b"print" => c.is_ascii_graphic() || c == b' ',
        b"punct" => c.is_ascii_punctuation(),
        b"space" => c.is_ascii_whitespace() || c == 0x0b,
        b"upper" => c.is_ascii_uppercase(),
        b"xdigit" => c.is_ascii_hexdigit(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wildcards_match_as_fnmatch_does() {
        let yes = [
            ("", ""),
            ("*", ""),
            ("*", "a/b.c"),
            ("a*", "a"),
            ("a*c", "abbbc"),
            ("a*b*c", "axxbyyc"),
            ("a?c", "abc"),
            (
                "pci:v00001AF4d*sv*sd*bc*sc*i*",
                "pci:v00001AF4d00001041sv00001AF4sd00001041bc02sc00i00",
            ),
            ("[abc]", "b"),
            ("[a-c]x", "cx"),
            ("[!a-c]", "d"),
            ("[^a-c]", "d"),
            ("[]]", "]"),
            ("[!]]", "a"),
            ("[a-]", "-"),
            ("[[:digit:]]", "7"),
            ("[[:xdigit:][:upper:]]", "Z"),
            ("\\*", "*"),
            ("[\\]]", "]"),
            ("[", "["),
            ("a[", "a["),
            ("*.*", ".x"),
            ("/*", "/a/b"),
        ];
        for (p, s) in yes {
            assert!(fnmatch(p, s), "{p:?} should match {s:?}");
        }
        let no = [
            ("", "a"),
            ("a", ""),
            ("a*c", "abcd"),
            ("a?c", "ac"),
            ("[abc]", "d"),
            ("[!a-c]", "b"),
            ("[a-c]", "-"),
            ("\\*", "a"),
            ("a\\", "a\\"),
            ("[[:nope:]]", "a"),
            ("[[:digit:]]", "a"),
            ("usb:v1D6Bp0001d*dc09*", "usb:v1D6Bp0002d0610dc09dsc00"),
        ];
        for (p, s) in no {
            assert!(!fnmatch(p, s), "{p:?} should not match {s:?}");
        }
    }

    #[test]
    fn adversarial_patterns_stay_fast() {
        let pattern = "*a".repeat(40) + "b";
        let text = "a".repeat(4000);
        let started = std::time::Instant::now();
        assert!(!fnmatch(&pattern, &text));
        // Exponential backtracking would take years; linear-times-pattern
        // takes well under a second even unoptimized.
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    const ALIASES: &str = "\
# Aliases extracted from modules themselves.
alias pci:v00001AF4d*sv*sd*bc*sc*i* virtio_pci
alias virtio:d00000001v* virtio_net
alias virtio:d00000002v* virtio-blk
alias pci:v00008086d0000100Esv*sd*bc*sc*i* e1000
alias pci:v000010DEd*sv*sd*bc03sc*i* nouveau
alias pci:v000010DEd*sv*sd*bc03sc02i00* nvidia
alias pci:v*d*sv*sd*bc03sc*i* fb_generic
alias platform:intel-spi spi_intel
alias acpi*:PNP0C0C:* button
alias fs-ext4 ext4

alias usb:v*p*d*dc*dsc*dp*ic09isc*ip0[12]in* hub_tt
alias of:N*T*C[oops odd_pattern
";

    #[test]
    fn parses_and_matches_like_modprobe() {
        let a = Aliases::parse(ALIASES).unwrap();
        assert_eq!(a.len(), 11, "the unclosed bracket is left out");
        assert_eq!(
            a.modules_for("pci:v00001AF4d00001041sv00001AF4sd00001041bc02sc00i00"),
            ["virtio_pci"]
        );
        assert_eq!(a.modules_for("virtio:d00000002v00001AF4"), ["virtio_blk"]);
        assert_eq!(
            a.modules_for("pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00"),
            ["nouveau", "nvidia", "fb_generic"]
        );
        assert_eq!(
            a.modules_for("pci:v000010DEd00002330sv000010DEsd000016C1bc03sc00i00"),
            ["nouveau", "fb_generic"]
        );
        assert_eq!(a.modules_for("platform:intel_spi"), ["spi_intel"]);
        assert_eq!(a.modules_for("platform:intel-spi"), ["spi_intel"]);
        assert_eq!(a.modules_for("acpi:PNP0C0C:"), ["button"]);
        assert_eq!(a.modules_for("acpixyz:PNP0C0C:q"), ["button"]);
        assert_eq!(
            a.modules_for("usb:v1D6Bp0002d0610dc09dsc00dp01ic09isc00ip01in00"),
            ["hub_tt"]
        );
        assert!(
            a.modules_for("usb:v1D6Bp0002d0610dc09dsc00dp01ic09isc00ip03in00")
                .is_empty()
        );
        assert!(a.modules_for("cpu:type:x86,ven0002").is_empty());
        assert!(a.modules_for("pci:[unclosed").is_empty());
        assert!(a.modules_for("").is_empty());
    }

    #[test]
    fn malformed_lines_say_where() {
        for bad in ["alias onlypattern", "options x y", "alias a b c"] {
            let err = Aliases::parse(&format!("# c\n{bad}\n")).unwrap_err();
            assert!(
                matches!(err, AliasError::Parse { line: 2, ref text } if text == bad),
                "{err}"
            );
        }
    }

    #[test]
    fn retained_aliases_write_back() {
        let mut a = Aliases::parse(ALIASES).unwrap();
        a.retain(|alias| alias.module.starts_with("virtio"));
        assert_eq!(
            a.to_text(),
            "alias pci:v00001AF4d*sv*sd*bc*sc*i* virtio_pci\n\
             alias virtio:d00000001v* virtio_net\n\
             alias virtio:d00000002v* virtio_blk\n"
        );
        let again = Aliases::parse(&a.to_text()).unwrap();
        assert_eq!(
            again.iter().collect::<Vec<_>>(),
            a.iter().collect::<Vec<_>>()
        );
        assert_eq!(
            again.modules_for("virtio:d00000001v00001AF4"),
            ["virtio_net"]
        );
        assert!(again.modules_for("fs-ext4").is_empty());
    }

    #[test]
    fn missing_file_says_how_to_make_it() {
        let dir = tempfile::tempdir().unwrap();
        let err = Aliases::open(dir.path(), "6.1.0-test").unwrap_err();
        assert!(matches!(err, AliasError::Missing { .. }), "{err}");
        assert!(err.to_string().contains("depmod"), "{err}");
        assert!(matches!(
            Aliases::open(dir.path(), "../x"),
            Err(AliasError::BadKernelVersion(_))
        ));
    }

    /// A straightforward recursive matcher: exponential, but obviously
    /// right on the short inputs proptest makes.
    fn reference(p: &[u8], s: &[u8]) -> bool {
        match p.first() {
            None => s.is_empty(),
            Some(b'*') => (0..=s.len()).any(|k| reference(&p[1..], &s[k..])),
            Some(_) => match s.first() {
                None => false,
                Some(&c) => match match_one(p, 0, c) {
                    Some(next) => reference(&p[next..], &s[1..]),
                    None => false,
                },
            },
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn star_backtracking_agrees_with_plain_recursion(
            pattern in "[ab*?\\[\\]!\\\\-]{0,10}",
            text in "[ab\\[\\]!*?\\\\-]{0,10}",
        ) {
            prop_assert_eq!(
                fnmatch(&pattern, &text),
                reference(pattern.as_bytes(), text.as_bytes()),
                "{:?} {:?}", pattern, text
            );
        }

        #[test]
        fn lookups_agree_with_scanning_every_alias(
            patterns in proptest::collection::vec("[ab:*?-]{0,6}", 0..12),
            query in "[ab:-]{0,8}",
        ) {
            let text: String = patterns
                .iter()
                .enumerate()
                .filter(|(_, p)| !p.is_empty())
                .map(|(i, p)| format!("alias {p} m{}\n", i % 4))
                .collect();
            let a = Aliases::parse(&text).unwrap();
            let q = normalize(&query).unwrap();
            let mut want: Vec<&str> = Vec::new();
            for alias in a.iter() {
                if fnmatch(&alias.pattern, &q) && !want.contains(&alias.module.as_str()) {
                    want.push(&alias.module);
                }
            }
            prop_assert_eq!(a.modules_for(&query), want);
        }
    }
}
