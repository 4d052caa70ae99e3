//! The uevent wire formats.
//!
//! **Kernel.** A `NETLINK_KOBJECT_UEVENT` datagram from the kernel is a
//! header `ACTION@DEVPATH`, then the event's environment, every string
//! NUL-terminated:
//!
//! ```text
//! add@/devices/pci0000:00/0000:00:03.0\0ACTION=add\0DEVPATH=/devices/pci0000:00/0000:00:03.0\0
//! SUBSYSTEM=pci\0PCI_ID=10DE:2330\0...\0SEQNUM=4242\0
//! ```
//!
//! The environment always carries `ACTION`, `DEVPATH` and `SUBSYSTEM`
//! (the kernel adds them first) and `SEQNUM`; the parser requires `ACTION`
//! and `DEVPATH` and that they agree with the header.
//!
//! **udev.** udevd sends the events it has processed to its own multicast
//! group with a binary header in front: the 8 bytes `libudev\0`, the magic
//! `0xfeedcafe` in network byte order, then in host byte order the header's
//! size, the offset and length of the properties (the same `KEY=VALUE\0`
//! strings, with no `ACTION@DEVPATH` line), and four filter hashes the
//! receiving kernel uses for socket filters. Such a message is parsed into
//! the same [`Uevent`] and reported as [`Message::Udev`].
//!
//! The bytes come from another process or from the kernel: parsing never
//! panics, bounds every length by the input, and a message it accepts
//! encodes back to one that parses to the same event.

use std::fmt;

/// The first bytes of a message udevd re-broadcasts.
pub const UDEV_PREFIX: &[u8; 8] = b"libudev\0";
/// The magic after [`UDEV_PREFIX`], in network byte order on the wire.
pub const UDEV_MAGIC: u32 = 0xfeed_cafe;
/// The size of the udev header this crate writes.
pub const UDEV_HEADER_LEN: usize = 40;
/// The header fields every udevd writes: prefix, magic, header size,
/// properties offset and length.
const UDEV_FIXED_LEN: usize = 24;

/// What happened to a device.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    Add,
    Remove,
    Change,
    Move,
    Online,
    Offline,
    /// A driver was bound to the device.
    Bind,
    /// The device's driver was unbound.
    Unbind,
    /// An action this crate does not know by name (a newer kernel's). Never
    /// holds one of the names above: [`Action::parse`] maps those.
    Other(String),
}

impl Action {
    /// The action named `text`, as the kernel spells it.
    pub fn parse(text: &str) -> Action {
        match text {
            "add" => Action::Add,
            "remove" => Action::Remove,
            "change" => Action::Change,
            "move" => Action::Move,
            "online" => Action::Online,
            "offline" => Action::Offline,
            "bind" => Action::Bind,
            "unbind" => Action::Unbind,
            other => Action::Other(other.to_owned()),
        }
    }

    /// The kernel's name for the action.
    pub fn as_str(&self) -> &str {
        match self {
            Action::Add => "add",
            Action::Remove => "remove",
            Action::Change => "change",
            Action::Move => "move",
            Action::Online => "online",
            Action::Offline => "offline",
            Action::Bind => "bind",
            Action::Unbind => "unbind",
            Action::Other(other) => other,
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why bytes are not a uevent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("empty message")]
    Empty,
    #[error("the header {0:?} is not ACTION@/DEVPATH")]
    BadHeader(String),
    #[error("a udev message's header is cut short or its magic is wrong")]
    BadUdevHeader,
    #[error("a udev message's properties lie outside it")]
    UdevPropertiesOutOfBounds,
    #[error("field {index} is not KEY=VALUE: {text:?}")]
    NotKeyValue { index: usize, text: String },
    #[error("field {index} is not UTF-8")]
    NotUtf8 { index: usize },
    #[error("property {0} appears twice")]
    Duplicate(String),
    #[error("no {0} property")]
    Missing(&'static str),
    #[error("the {key} property {value:?} disagrees with the header's {header:?}")]
    Inconsistent {
        key: &'static str,
        value: String,
        header: String,
    },
    #[error("the action {0:?} is empty or holds '@'")]
    BadAction(String),
    #[error("the device path {0:?} does not start with '/'")]
    BadDevpath(String),
    #[error("the message was longer than the {0}-byte receive buffer")]
    Truncated(usize),
}

/// One device event: its action, its device path under `/sys`, and every
/// property in the order it came (`ACTION` and `DEVPATH` among them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uevent {
    action: Action,
    devpath: String,
    properties: Vec<(String, String)>,
}

/// A parsed datagram: which format it came in, and the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// The kernel's own format (`ACTION@DEVPATH` first).
    Kernel(Uevent),
    /// udevd's re-broadcast (`libudev` header first).
    Udev(Uevent),
}

impl Message {
    /// The event, whichever format it came in.
    pub fn uevent(&self) -> &Uevent {
        match self {
            Message::Kernel(event) | Message::Udev(event) => event,
        }
    }

    /// The event, whichever format it came in.
    pub fn into_uevent(self) -> Uevent {
        match self {
            Message::Kernel(event) | Message::Udev(event) => event,
        }
    }
}

impl Uevent {
    /// An event from its properties, in order. `ACTION` and `DEVPATH` are
    /// required; keys are non-empty, unique, hold no `=` and no NUL;
    /// values hold no NUL.
    pub fn from_properties<K, V>(
        properties: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Uevent, ParseError>
    where
        K: Into<String>,
        V: Into<String>,
    {
        let properties: Vec<(String, String)> = properties
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        let mut seen = std::collections::HashSet::with_capacity(properties.len());
        for (index, (key, value)) in properties.iter().enumerate() {
            if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
                return Err(ParseError::NotKeyValue {
                    index,
                    text: format!("{key}={value}"),
                });
            }
            if !seen.insert(key.as_str()) {
                return Err(ParseError::Duplicate(key.clone()));
            }
        }
        let find = |name: &'static str| {
            properties
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .ok_or(ParseError::Missing(name))
        };
        let action = find("ACTION")?;
        if action.is_empty() || action.contains('@') {
            return Err(ParseError::BadAction(action));
        }
        let devpath = find("DEVPATH")?;
        if !devpath.starts_with('/') {
            return Err(ParseError::BadDevpath(devpath));
        }
        Ok(Uevent {
            action: Action::parse(&action),
            devpath,
            properties,
        })
    }

    /// What happened.
    pub fn action(&self) -> &Action {
        &self.action
    }

    /// The device's path under `/sys`, e.g. `/devices/pci0000:00/0000:00:03.0`.
    pub fn devpath(&self) -> &str {
        &self.devpath
    }

    /// The value of property `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.properties
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every property, in the order it came.
    pub fn properties(&self) -> impl Iterator<Item = (&str, &str)> {
        self.properties
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// `SUBSYSTEM`: `pci`, `net`, `tpm`, `module`, ...
    pub fn subsystem(&self) -> Option<&str> {
        self.get("SUBSYSTEM")
    }

    /// `SEQNUM`: the kernel's event counter.
    pub fn seqnum(&self) -> Option<u64> {
        self.get("SEQNUM")?.parse().ok()
    }

    /// `MODALIAS`: what a driver must match to bind the device.
    pub fn modalias(&self) -> Option<&str> {
        self.get("MODALIAS")
    }

    /// `DRIVER`: the bound driver, on events sent while one is bound.
    pub fn driver(&self) -> Option<&str> {
        self.get("DRIVER")
    }

    /// The kernel's format: `ACTION@DEVPATH\0` and every property
    /// `KEY=VALUE\0`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_properties_len() + 64);
        out.extend_from_slice(self.action.as_str().as_bytes());
        out.push(b'@');
        out.extend_from_slice(self.devpath.as_bytes());
        out.push(0);
        self.encode_properties(&mut out);
        out
    }

    /// udevd's format: the 40-byte `libudev` header and the properties.
    /// The filter hashes are zero, so a receiver with a subsystem or tag
    /// socket filter drops it; receivers without filters (this crate's
    /// monitor among them) read it whole.
    pub fn encode_udev(&self) -> Vec<u8> {
        let len = self.encoded_properties_len();
        let mut out = Vec::with_capacity(UDEV_HEADER_LEN + len);
        out.extend_from_slice(UDEV_PREFIX);
        out.extend_from_slice(&UDEV_MAGIC.to_be_bytes());
        for field in [UDEV_HEADER_LEN, UDEV_HEADER_LEN, len] {
            // The lengths are bounded by the properties' allocation.
            let field = u32::try_from(field).unwrap_or(u32::MAX);
            out.extend_from_slice(&field.to_ne_bytes());
        }
        out.extend_from_slice(&[0; 16]);
        self.encode_properties(&mut out);
        out
    }

    fn encoded_properties_len(&self) -> usize {
        self.properties
            .iter()
            .map(|(k, v)| k.len() + v.len() + 2)
            .sum()
    }

    fn encode_properties(&self, out: &mut Vec<u8>) {
        for (key, value) in &self.properties {
            out.extend_from_slice(key.as_bytes());
            out.push(b'=');
            out.extend_from_slice(value.as_bytes());
            out.push(0);
        }
    }
}

impl fmt::Display for Uevent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.action, self.devpath)?;
        if let Some(subsystem) = self.subsystem() {
            write!(f, " ({subsystem})")?;
        }
        Ok(())
    }
}

/// Parses one datagram in either format.
pub fn parse(bytes: &[u8]) -> Result<Message, ParseError> {
    if bytes.is_empty() {
        return Err(ParseError::Empty);
    }
    if bytes.starts_with(UDEV_PREFIX) {
        return parse_udev(bytes).map(Message::Udev);
    }
    parse_kernel(bytes).map(Message::Kernel)
}

fn parse_kernel(bytes: &[u8]) -> Result<Uevent, ParseError> {
    let (header, rest) = match bytes.iter().position(|&b| b == 0) {
        Some(end) => (&bytes[..end], &bytes[end + 1..]),
        None => (bytes, &[][..]),
    };
    let header_text = String::from_utf8_lossy(header);
    let bad_header = || ParseError::BadHeader(header_text.clone().into_owned());
    let header = std::str::from_utf8(header).map_err(|_| bad_header())?;
    let (action, devpath) = header.split_once('@').ok_or_else(bad_header)?;
    if action.is_empty() || !devpath.starts_with('/') {
        return Err(bad_header());
    }
    let event = Uevent::from_properties(fields(rest)?)?;
    if event.action.as_str() != action {
        return Err(ParseError::Inconsistent {
            key: "ACTION",
            value: event.action.as_str().to_owned(),
            header: action.to_owned(),
        });
    }
    if event.devpath != devpath {
        return Err(ParseError::Inconsistent {
            key: "DEVPATH",
            value: event.devpath.clone(),
            header: devpath.to_owned(),
        });
    }
    Ok(event)
}

fn parse_udev(bytes: &[u8]) -> Result<Uevent, ParseError> {
    let word = |at: usize| -> Option<[u8; 4]> { bytes.get(at..at + 4)?.try_into().ok() };
    let magic = word(8).map(u32::from_be_bytes);
    let header_size = word(12).map(u32::from_ne_bytes);
    let offset = word(16).map(u32::from_ne_bytes);
    let len = word(20).map(u32::from_ne_bytes);
    let (Some(UDEV_MAGIC), Some(header_size), Some(offset), Some(len)) =
        (magic, header_size, offset, len)
    else {
        return Err(ParseError::BadUdevHeader);
    };
    if (header_size as usize) < UDEV_FIXED_LEN {
        return Err(ParseError::BadUdevHeader);
    }
    let start = offset as usize;
    let end = start
        .checked_add(len as usize)
        .ok_or(ParseError::UdevPropertiesOutOfBounds)?;
    if start < UDEV_FIXED_LEN {
        return Err(ParseError::UdevPropertiesOutOfBounds);
    }
    let properties = bytes
        .get(start..end)
        .ok_or(ParseError::UdevPropertiesOutOfBounds)?;
    Uevent::from_properties(fields(properties)?)
}

/// `KEY=VALUE` strings separated (and usually ended) by NUL; empty strings
/// are skipped.
fn fields(bytes: &[u8]) -> Result<Vec<(String, String)>, ParseError> {
    let mut out = Vec::new();
    for (index, field) in bytes.split(|&b| b == 0).enumerate() {
        if field.is_empty() {
            continue;
        }
        let text = std::str::from_utf8(field).map_err(|_| ParseError::NotUtf8 { index })?;
        match text.split_once('=') {
            Some((key, value)) if !key.is_empty() => out.push((key.to_owned(), value.to_owned())),
            _ => {
                return Err(ParseError::NotKeyValue {
                    index,
                    text: text.to_owned(),
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What `udevadm monitor -k -p` showed for a synthetic `change` on a
    /// virtio PCI function, as the kernel sent it.
    const PCI_CHANGE: &[u8] = b"change@/devices/pci0000:00/0000:00:01.0\0ACTION=change\0\
DEVPATH=/devices/pci0000:00/0000:00:01.0\0SUBSYSTEM=pci\0SYNTH_UUID=0\0DRIVER=virtio-pci\0\
PCI_CLASS=FFFF00\0PCI_ID=1AF4:1045\0PCI_SUBSYS_ID=1AF4:1045\0PCI_SLOT_NAME=0000:00:01.0\0\
MODALIAS=pci:v00001AF4d00001045sv00001AF4sd00001045bcFFscFFi00\0SEQNUM=830\0";

    #[test]
    fn parses_a_kernel_event() {
        let Message::Kernel(event) = parse(PCI_CHANGE).unwrap() else {
            panic!("not a kernel message");
        };
        assert_eq!(event.action(), &Action::Change);
        assert_eq!(event.devpath(), "/devices/pci0000:00/0000:00:01.0");
        assert_eq!(event.subsystem(), Some("pci"));
        assert_eq!(event.driver(), Some("virtio-pci"));
        assert_eq!(event.seqnum(), Some(830));
        assert_eq!(
            event.modalias(),
            Some("pci:v00001AF4d00001045sv00001AF4sd00001045bcFFscFFi00")
        );
        assert_eq!(event.properties().count(), 11);
        assert_eq!(event.encode(), PCI_CHANGE);
        assert_eq!(
            event.to_string(),
            "change /devices/pci0000:00/0000:00:01.0 (pci)"
        );
    }

    #[test]
    fn devpaths_may_hold_at_signs() {
        let bytes = b"add@/devices/platform/soc@0/serial@1\0ACTION=add\0\
DEVPATH=/devices/platform/soc@0/serial@1\0SUBSYSTEM=platform\0";
        let event = parse(bytes).unwrap().into_uevent();
        assert_eq!(event.devpath(), "/devices/platform/soc@0/serial@1");
        // The last NUL is optional, and empty fields are skipped.
        let event2 = parse(&bytes[..bytes.len() - 1]).unwrap().into_uevent();
        assert_eq!(event, event2);
        let mut padded = bytes.to_vec();
        padded.extend_from_slice(b"\0\0");
        assert_eq!(parse(&padded).unwrap().into_uevent(), event);
    }

    #[test]
    fn parses_a_udev_message() {
        let kernel = parse(PCI_CHANGE).unwrap().into_uevent();
        let udev = kernel.encode_udev();
        assert_eq!(&udev[..8], UDEV_PREFIX);
        assert_eq!(parse(&udev).unwrap(), Message::Udev(kernel.clone()));
        // A longer header from a newer udevd is skipped by its offset.
        let mut longer = udev[..UDEV_HEADER_LEN].to_vec();
        longer[12..16].copy_from_slice(&48u32.to_ne_bytes());
        longer[16..20].copy_from_slice(&48u32.to_ne_bytes());
        longer.extend_from_slice(&[0xAA; 8]);
        longer.extend_from_slice(&udev[UDEV_HEADER_LEN..]);
        assert_eq!(parse(&longer).unwrap(), Message::Udev(kernel));
    }

    #[test]
    fn rejects_what_is_not_a_uevent() {
        let cases: &[(&[u8], ParseError)] = &[
            (b"", ParseError::Empty),
            (b"add", ParseError::BadHeader("add".into())),
            (
                b"add@devices\0ACTION=add\0DEVPATH=/d\0",
                ParseError::BadHeader("add@devices".into()),
            ),
            (b"@/d\0", ParseError::BadHeader("@/d".into())),
            (b"add@/d\0ACTION=add\0", ParseError::Missing("DEVPATH")),
            (b"add@/d\0DEVPATH=/d\0", ParseError::Missing("ACTION")),
            (
                b"add@/d\0ACTION=remove\0DEVPATH=/d\0",
                ParseError::Inconsistent {
                    key: "ACTION",
                    value: "remove".into(),
                    header: "add".into(),
                },
            ),
            (
                b"add@/d\0ACTION=add\0DEVPATH=/e\0",
                ParseError::Inconsistent {
                    key: "DEVPATH",
                    value: "/e".into(),
                    header: "/d".into(),
                },
            ),
            (
                b"add@/d\0ACTION=add\0DEVPATH=/d\0NOEQUALS\0",
                ParseError::NotKeyValue {
                    index: 2,
                    text: "NOEQUALS".into(),
                },
            ),
            (
                b"add@/d\0ACTION=add\0=v\0",
                ParseError::NotKeyValue {
                    index: 1,
                    text: "=v".into(),
                },
            ),
            (
                b"add@/d\0ACTION=add\0DEVPATH=/d\0ACTION=add\0",
                ParseError::Duplicate("ACTION".into()),
            ),
            (
                b"add@/d\0ACTION=add\0DEVPATH=/d\0K=\xff\0",
                ParseError::NotUtf8 { index: 2 },
            ),
            (b"libudev\0\xfe\xed\xca", ParseError::BadUdevHeader),
            (
                b"libudev\0\xfe\xed\xca\xfe\0\0\0\0\0\0\0\0\0\0\0\0",
                ParseError::BadUdevHeader,
            ),
        ];
        for (bytes, want) in cases {
            assert_eq!(parse(bytes).as_ref(), Err(want), "{bytes:?}");
        }
        let event = parse(PCI_CHANGE).unwrap().into_uevent();
        let mut udev = event.encode_udev();
        udev[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert_eq!(parse(&udev), Err(ParseError::UdevPropertiesOutOfBounds));
        let mut udev = event.encode_udev();
        udev[16..20].copy_from_slice(&4u32.to_ne_bytes());
        assert_eq!(parse(&udev), Err(ParseError::UdevPropertiesOutOfBounds));
        let mut udev = event.encode_udev();
        udev[8] = 0;
        assert_eq!(parse(&udev), Err(ParseError::BadUdevHeader));
    }

    #[test]
    fn actions_round_trip_by_name() {
        for name in [
            "add", "remove", "change", "move", "online", "offline", "bind", "unbind", "frob",
        ] {
            assert_eq!(Action::parse(name).as_str(), name);
        }
        assert_eq!(Action::parse("frob"), Action::Other("frob".into()));
    }

    fn text(allowed: &'static str) -> impl Strategy<Value = String> {
        proptest::string::string_regex(allowed).expect("valid regex")
    }

    /// Events as the kernel could send them, with odd but legal text.
    fn arb_event() -> impl Strategy<Value = Uevent> {
        let action = prop_oneof![
            Just("add".to_owned()),
            Just("remove".to_owned()),
            Just("bind".to_owned()),
            Just("unbind".to_owned()),
            text("[a-z]{1,8}"),
        ];
        let devpath = text("/[^\\x00]{0,40}");
        let extra = proptest::collection::vec(
            (
                text("[A-Z_][A-Za-z0-9_@/.:-]{0,12}"),
                text("[^\\x00]{0,40}"),
            ),
            0..12,
        );
        (action, devpath, extra).prop_map(|(action, devpath, extra)| {
            let mut props = vec![
                ("ACTION".to_owned(), action),
                ("DEVPATH".to_owned(), devpath),
            ];
            for (k, v) in extra {
                if !props.iter().any(|(key, _)| *key == k) {
                    props.push((k, v));
                }
            }
            Uevent::from_properties(props).expect("generated event is valid")
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn encoded_events_parse_back(event in arb_event()) {
            prop_assert_eq!(parse(&event.encode()), Ok(Message::Kernel(event.clone())));
            prop_assert_eq!(parse(&event.encode_udev()), Ok(Message::Udev(event)));
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_accepted_ones_round_trip(
            bytes in proptest::collection::vec(any::<u8>(), 0..300)
        ) {
            if let Ok(message) = parse(&bytes) {
                let event = message.uevent();
                prop_assert_eq!(parse(&event.encode()), Ok(Message::Kernel(event.clone())));
            }
        }

        /// Valid messages with bytes flipped, cut or inserted: still no
        /// panic, and what is accepted round-trips.
        #[test]
        fn mutated_messages_never_panic(
            event in arb_event(),
            udev in any::<bool>(),
            edits in proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 1..6),
        ) {
            let mut bytes = if udev { event.encode_udev() } else { event.encode() };
            for (at, byte, kind) in edits {
                let at = at % (bytes.len() + 1);
                match kind {
                    0 if at < bytes.len() => bytes[at] = byte,
                    1 => bytes.truncate(at),
                    _ => bytes.insert(at, byte),
                }
            }
            if let Ok(message) = parse(&bytes) {
                let event = message.uevent();
                prop_assert_eq!(parse(&event.encode()), Ok(Message::Kernel(event.clone())));
                prop_assert_eq!(parse(&event.encode_udev()), Ok(Message::Udev(event.clone())));
            }
        }
    }
}
