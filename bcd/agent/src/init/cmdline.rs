//! The ramdisk's configuration, read from the kernel command line.
//!
//! Words are split the way the kernel's `next_arg` splits them: on white
//! space outside double quotes, `name=value` at the first `=`, and quotes
//! around a value (or around the whole word) dropped. `--` ends the
//! kernel's parameters. Only `bcd.*` parameters are ours; the last one of a
//! name wins, as with the kernel's own parameters.
//!
//! | parameter | meaning |
//! |---|---|
//! | `bcd.server=https://HOST:PORT` | the control plane to join and keep a session with |
//! | `bcd.token=bct1....` | a join token, used only while the node has no identity |
//! | `bcd.attestor=tpm` | join by TPM attestation (`bcd join --attestor tpm`; default `token`) |
//! | `bcd.ca_pin=HEX` | the fleet CA's pin, for a TPM machine enrolled by its EK: no token needed |
//! | `bcd.state=LABEL` | keep the identity on the ext2/3/4 filesystem with this label |
//! | `bcd.hostname=NAME` | the host name (default: `node-` and the first NIC's MAC) |
//! | `bcd.iface=NAME` | run DHCP on this interface only (default: every Ethernet interface) |
//! | `bcd.log=FILTER` | `BCD_LOG` for the daemon (`info`, `debug`, ...) |
//! | `bcd.image=ID` | the image this boot came from (set by the boot endpoint's iPXE script) |
//! | `bcd.mac=MAC` | the MAC address that network-booted (set by the iPXE script) |

use std::fmt;

/// The `bcd.*` settings of one boot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    pub server: Option<String>,
    pub token: Option<String>,
    /// `tpm` or `token`.
    pub attestor: Option<String>,
    pub ca_pin: Option<String>,
    pub state: Option<String>,
    pub hostname: Option<String>,
    pub iface: Option<String>,
    pub log: Option<String>,
    pub image: Option<String>,
    pub mac: Option<String>,
    /// `bcd.*` names this build does not know, reported once at boot.
    pub unknown: Vec<String>,
}

/// A `bcd.*` parameter whose value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmdlineError {
    #[error(
        "bcd.server={0:?} is not an https:// URL: set bcd.server=https://HOST:PORT on the kernel command line"
    )]
    Server(String),
    #[error(
        "bcd.state={0:?} is not a filesystem label (1 to 16 bytes, no white space or slash): fix \
         the kernel command line"
    )]
    Label(String),
    #[error(
        "bcd.hostname={0:?} is not a host name (1 to 63 letters, digits, '-' and '.'): fix the \
         kernel command line"
    )]
    Hostname(String),
    #[error(
        "bcd.iface={0:?} is not an interface name (1 to 15 bytes, no '/'): fix the kernel command line"
    )]
    Iface(String),
    #[error("{0} takes a value ({0}=...): fix the kernel command line")]
    Empty(String),
    #[error("bcd.attestor={0:?} is neither tpm nor token: fix the kernel command line")]
    Attestor(String),
    #[error(
        "bcd.ca_pin={0:?} is not the fleet CA's pin (64 hex digits, as better-compute machines \
         enroll prints it): fix the kernel command line"
    )]
    Pin(String),
}

/// The kernel's split of a command line into `(name, value)` pairs, up to
/// `--`. A word without `=` has no value.
pub fn words(line: &str) -> Vec<(String, Option<String>)> {
    let b = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= b.len() {
            break;
        }
        let mut start = i;
        let mut in_quote = false;
        let mut quoted = false;
        if b[i] == b'"' {
            start += 1;
            i += 1;
            in_quote = true;
            quoted = true;
        }
        let mut equals = None;
        while i < b.len() {
            if b[i].is_ascii_whitespace() && !in_quote {
                break;
            }
            if equals.is_none() && b[i] == b'=' {
                equals = Some(i);
            }
            if b[i] == b'"' {
                in_quote = !in_quote;
            }
            i += 1;
        }
        let end = i;
        let word = &line[start..end];
        if word == "--" && !quoted {
            break;
        }
        let (name, value) = match equals {
            None => (strip_trailing_quote(word, quoted), None),
            Some(eq) => {
                let name = &line[start..eq];
                let mut value = &line[eq + 1..end];
                if let Some(v) = value.strip_prefix('"') {
                    value = v.strip_suffix('"').unwrap_or(v);
                } else if quoted {
                    value = value.strip_suffix('"').unwrap_or(value);
                }
                (name, Some(value))
            }
        };
        out.push((name.to_string(), value.map(str::to_string)));
    }
    out
}

fn strip_trailing_quote(word: &str, quoted: bool) -> &str {
    if quoted {
        word.strip_suffix('"').unwrap_or(word)
    } else {
        word
    }
}

/// Reads the `bcd.*` settings from a kernel command line. Other parameters
/// are the kernel's and are ignored.
pub fn parse(line: &str) -> Result<Config, CmdlineError> {
    let mut c = Config::default();
    for (name, value) in words(line) {
        let Some(key) = name.strip_prefix("bcd.") else {
            continue;
        };
        let slot = match key {
            "server" => &mut c.server,
            "token" => &mut c.token,
            "attestor" => &mut c.attestor,
            "ca_pin" => &mut c.ca_pin,
            "state" => &mut c.state,
            "hostname" => &mut c.hostname,
            "iface" => &mut c.iface,
            "log" => &mut c.log,
            "image" => &mut c.image,
            "mac" => &mut c.mac,
            _ => {
                if !c.unknown.contains(&name) {
                    c.unknown.push(name);
                }
                continue;
            }
        };
        match value {
            Some(v) if !v.is_empty() => *slot = Some(v),
            _ => return Err(CmdlineError::Empty(name)),
        }
    }
    if let Some(s) = &c.server
        && !(s.starts_with("https://") && s.len() > "https://".len())
    {
        return Err(CmdlineError::Server(s.clone()));
    }
    if let Some(a) = &c.attestor
        && a != "tpm"
        && a != "token"
    {
        return Err(CmdlineError::Attestor(a.clone()));
    }
    if let Some(p) = &c.ca_pin
        && !(p.len() == 64 && p.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(CmdlineError::Pin(p.clone()));
    }
    if let Some(l) = &c.state
        && !valid_label(l)
    {
        return Err(CmdlineError::Label(l.clone()));
    }
    if let Some(h) = &c.hostname
        && !valid_hostname(h)
    {
        return Err(CmdlineError::Hostname(h.clone()));
    }
    if let Some(i) = &c.iface
        && (i.is_empty() || i.len() > 15 || i.contains(['/', ' ', '\0']))
    {
        return Err(CmdlineError::Iface(i.clone()));
    }
    Ok(c)
}

/// An ext2/3/4 volume label: up to 16 bytes.
pub fn valid_label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 16
        && !l.contains('/')
        && !l.bytes().any(|b| b.is_ascii_whitespace() || b == 0)
}

pub fn valid_hostname(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 63
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !h.starts_with(['-', '.'])
}

impl Config {
    /// The machine joins by TPM attestation (`bcd.attestor=tpm`).
    pub fn tpm(&self) -> bool {
        self.attestor.as_deref() == Some("tpm")
    }
}

impl fmt::Display for Config {
    /// The settings for the console, the token's secret left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
        write!(
            f,
            "server {} token {} attestor {} state {} hostname {} iface {}",
            show(&self.server),
            if self.token.is_some() { "set" } else { "-" },
            self.attestor.as_deref().unwrap_or("token"),
            show(&self.state),
            show(&self.hostname),
            show(&self.iface),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_bcd_parameters_and_ignores_the_kernels() {
        let c = parse(
            "BOOT_IMAGE=/vmlinuz console=ttyS0 quiet bcd.server=https://10.0.2.100:7443 \
             bcd.token=bct1.a.b.c bcd.state=bcd-state bcd.frobnicate=1 bcd.hostname=gpu-1",
        )
        .unwrap();
        assert_eq!(c.server.as_deref(), Some("https://10.0.2.100:7443"));
        assert_eq!(c.token.as_deref(), Some("bct1.a.b.c"));
        assert_eq!(c.state.as_deref(), Some("bcd-state"));
        assert_eq!(c.hostname.as_deref(), Some("gpu-1"));
        assert_eq!(c.unknown, vec!["bcd.frobnicate".to_string()]);
        assert!(!c.to_string().contains("bct1"), "{c}");
    }

    #[test]
    fn splits_like_the_kernel() {
        assert_eq!(
            words(r#"a "b=c d" e="f g" h=i"j k"l -- bcd.server=x"#),
            vec![
                ("a".into(), None),
                ("b".into(), Some("c d".into())),
                ("e".into(), Some("f g".into())),
                ("h".into(), Some(r#"i"j k"l"#.into())),
            ]
        );
        assert_eq!(words("  \t\n "), vec![]);
        assert_eq!(words("x=\n"), vec![("x".into(), Some(String::new()))]);
    }

    #[test]
    fn the_last_one_wins_and_bad_values_say_what_to_fix() {
        let c = parse("bcd.log=info bcd.log=debug").unwrap();
        assert_eq!(c.log.as_deref(), Some("debug"));
        assert_eq!(
            parse("bcd.server=http://x").unwrap_err(),
            CmdlineError::Server("http://x".into())
        );
        assert_eq!(
            parse("bcd.state=seventeen-bytes-xx").unwrap_err(),
            CmdlineError::Label("seventeen-bytes-xx".into())
        );
        assert_eq!(
            parse("bcd.token").unwrap_err(),
            CmdlineError::Empty("bcd.token".into())
        );
        assert!(
            parse("bcd.hostname=a_b")
                .unwrap_err()
                .to_string()
                .contains("fix the kernel command line")
        );
    }

    #[test]
    fn a_tpm_machine_needs_a_pin_and_no_token() {
        let pin = "ab".repeat(32);
        let c = parse(&format!(
            "bcd.server=https://s:1 bcd.attestor=tpm bcd.ca_pin={pin}"
        ))
        .unwrap();
        assert!(c.tpm());
        assert_eq!(c.ca_pin.as_deref(), Some(pin.as_str()));
        assert!(c.to_string().contains("attestor tpm"), "{c}");
        assert!(!parse("bcd.attestor=token").unwrap().tpm());
        assert_eq!(
            parse("bcd.attestor=tmp").unwrap_err(),
            CmdlineError::Attestor("tmp".into())
        );
        let e = parse("bcd.ca_pin=abc").unwrap_err();
        assert_eq!(e, CmdlineError::Pin("abc".into()));
        assert!(e.to_string().contains("64 hex digits"), "{e}");
    }

    proptest! {
        #[test]
        fn any_line_parses_or_is_refused_without_panicking(line in "\\PC{0,200}") {
            let _ = parse(&line);
            for (name, value) in words(&line) {
                prop_assert!(line.contains(&name));
                if let Some(v) = value {
                    prop_assert!(line.contains(&v));
                }
            }
        }

        #[test]
        fn quoted_values_come_back_whole(
            name in "bcd\\.[a-z]{1,8}",
            value in "[a-zA-Z0-9 ./:=-]{0,40}",
            before in "[a-z=]{0,10}",
        ) {
            let line = format!("{before} {name}=\"{value}\" tail");
            let w = words(&line);
            prop_assert!(w.contains(&(name.clone(), Some(value.clone()))), "{:?}", w);
            prop_assert_eq!(w.last().unwrap(), &("tail".to_string(), None));
        }

        #[test]
        fn plain_words_split_on_white_space(ws in proptest::collection::vec("[a-z.]{1,6}(=[a-z0-9]{0,6})?", 0..10)) {
            let line = ws.join("  \t");
            let w = words(&line);
            prop_assert_eq!(w.len(), ws.len());
            for ((name, value), orig) in w.iter().zip(&ws) {
                match orig.split_once('=') {
                    Some((n, v)) => prop_assert_eq!((name.as_str(), value.as_deref()), (n, Some(v))),
                    None => prop_assert_eq!((name.as_str(), value.as_deref()), (orig.as_str(), None)),
                }
            }
        }
    }
}
