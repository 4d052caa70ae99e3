//! Checks of everything a client sends, as untrusted input.
//!
//! Each function here is pure (the one exception, [`check_gpu`], reads
//! only under the sysfs root it is given) and turns wire values into typed
//! ones that can only hold what passed: an [`AllocationId`] is a safe file
//! name, a [`CdiSpec`] is a parsed `nvidia.com/gpu` spec without hooks, a
//! [`TpmCommand`] is a well-formed TPM 2.0 command the attestor sends. Every
//! size is bounded, and error texts quote at most a short prefix of what
//! they refuse, so a hostile peer cannot make the helper log megabytes.
//!
//! The sshd and firewall checks are those of the agent's access converger
//! (`bcd/agent/src/access.rs`), so a spec the daemon accepts is one the
//! helper accepts.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::path::Path;

use crate::wire;

/// A request field that does not pass, with the reason worded for the
/// operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

fn invalid(message: impl Into<String>) -> Invalid {
    Invalid(message.into())
}

/// `s` quoted for an error text, at most about 96 bytes of it.
pub(crate) fn shown(s: &str) -> String {
    // Bounded after escaping: one unprintable character escapes to as
    // many as ten bytes.
    const MAX: usize = 96;
    let quoted = format!("{s:?}");
    if quoted.len() <= MAX {
        return quoted;
    }
    let mut cut = MAX;
    while !quoted.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}... ({} bytes)", &quoted[..cut], s.len())
}

/// An allocation id: 1 to 64 letters, digits, `.`, `_`, `-`; not starting
/// with `.`; no `..`.
pub const MAX_ALLOCATION_ID: usize = 64;
/// GPUs named in one env file.
pub const MAX_DEVICES: usize = 64;
/// A device name (a GPU UUID, a MIG UUID or an index).
pub const MAX_DEVICE_NAME: usize = 64;
/// Extra variables in one env file.
pub const MAX_ENV: usize = 256;
pub const MAX_ENV_KEY: usize = 128;
pub const MAX_ENV_VALUE: usize = 4096;
/// Variables the helper writes itself from the devices, or that would
/// change which devices or which code a workload gets: refused in `env`.
pub const RESERVED_ENV: &[&str] = &[
    "NVIDIA_VISIBLE_DEVICES",
    "CDI_DEVICES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
];
/// The dynamic loader's variables (`LD_PRELOAD`, `LD_LIBRARY_PATH`, ...):
/// an env file is read by whatever starts the workload, possibly as root.
pub const RESERVED_ENV_PREFIXES: &[&str] = &["LD_"];
pub const MAX_USERS: usize = 1024;
pub const MAX_KEYS_PER_USER: usize = 256;
pub const MAX_PRINCIPALS_PER_USER: usize = 256;
pub const MAX_CA_KEYS: usize = 64;
/// One authorized_keys line (a 16384-bit RSA key is about 2.8 KB).
pub const MAX_KEY_LINE: usize = 16 * 1024;
pub const MAX_PRINCIPAL: usize = 256;
pub const MAX_RULES: usize = 1024;
/// A file name in the helper's staging directory.
pub const MAX_FILE_NAME: usize = 128;
/// The kernel command line (x86's COMMAND_LINE_SIZE, less the NUL).
pub const MAX_CMDLINE: usize = 2047;
pub const MAX_REASON: usize = 256;
/// A TPM command: TPM_MAX_COMMAND_SIZE of common TPMs, and the attestor's
/// own buffer.
pub const MAX_TPM_COMMAND: usize = 4096;
/// A secret's value: the broker's own bound
/// (`bcd_proto::secret::MAX_VALUE`).
pub const MAX_SECRET: usize = 64 * 1024;
/// Secret files named in one retain request.
pub const MAX_SECRET_FILES: usize = 4096;
/// A secret's file name in its allocation's directory.
pub const MAX_SECRET_FILE: usize = 64;
/// A CDI spec (the frame limit bounds it too).
pub const MAX_CDI_SPEC: usize = 1024 * 1024;

fn check_file_name(what: &str, s: &str, max: usize) -> Result<(), Invalid> {
    let ok = !s.is_empty()
        && s.len() <= max
        && !s.starts_with('.')
        && !s.contains("..")
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "{what} {} must be 1-{max} letters, digits, '.', '_' or '-', not starting with '.' and without '..'",
            shown(s)
        )))
    }
}

/// An allocation's id, safe as a file name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AllocationId(String);

impl AllocationId {
    pub fn parse(s: &str) -> Result<AllocationId, Invalid> {
        check_file_name("allocation id", s, MAX_ALLOCATION_ID)?;
        Ok(AllocationId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The env file's name in the env directory: `<id>.env`.
    pub fn env_file_name(&self) -> String {
        format!("{}.env", self.0)
    }
}

impl fmt::Display for AllocationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An environment variable name: `[A-Za-z_][A-Za-z0-9_]*`, bounded, not
/// reserved.
pub fn check_env_key(key: &str) -> Result<(), Invalid> {
    let ok = key.len() <= MAX_ENV_KEY
        && key
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !ok {
        return Err(invalid(format!(
            "{} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*, at most {MAX_ENV_KEY})",
            shown(key)
        )));
    }
    if RESERVED_ENV.contains(&key) {
        return Err(invalid(format!(
            "{key} is reserved: bcd writes it from the allocation's GPUs"
        )));
    }
    if let Some(p) = RESERVED_ENV_PREFIXES.iter().find(|p| key.starts_with(*p)) {
        return Err(invalid(format!(
            "{key} is reserved: {p}* variables steer the dynamic loader of whatever reads the env file"
        )));
    }
    Ok(())
}

/// A value of an env file line: bounded, without NUL or a line break.
pub fn check_env_value(key: &str, value: &str) -> Result<(), Invalid> {
    if value.len() > MAX_ENV_VALUE {
        return Err(invalid(format!(
            "the value of {key} has {} bytes, more than {MAX_ENV_VALUE}",
            value.len()
        )));
    }
    if value.contains(['\0', '\n', '\r']) {
        return Err(invalid(format!(
            "the value of {key} must not hold a NUL or a line break"
        )));
    }
    Ok(())
}

/// A GPU as the CDI spec names it: a UUID (`GPU-...`, `MIG-...`) or an
/// index.
pub fn check_device_name(name: &str) -> Result<(), Invalid> {
    let ok = !name.is_empty()
        && name.len() <= MAX_DEVICE_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "device {} must be a GPU UUID or index (letters, digits, '-', at most {MAX_DEVICE_NAME})",
            shown(name)
        )))
    }
}

/// Where one secret goes: `<secrets dir>/ALLOCATION/FILE`, both safe
/// file names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SecretPath {
    pub allocation: AllocationId,
    file: String,
}

impl SecretPath {
    pub fn parse(allocation: &str, file: &str) -> Result<SecretPath, Invalid> {
        let allocation = AllocationId::parse(allocation)?;
        check_file_name("secret file", file, MAX_SECRET_FILE)?;
        Ok(SecretPath {
            allocation,
            file: file.to_string(),
        })
    }

    pub fn file(&self) -> &str {
        &self.file
    }

    pub fn to_wire(&self) -> wire::SecretFile {
        wire::SecretFile {
            allocation_id: self.allocation.0.clone(),
            file: self.file.clone(),
        }
    }
}

impl fmt::Display for SecretPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.allocation, self.file)
    }
}

/// A secret's value: at most [`MAX_SECRET`] bytes, never shown (its
/// `Debug` says only its length, so no log line carries it).
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(Vec<u8>);

impl SecretValue {
    pub fn parse(path: &SecretPath, value: Vec<u8>) -> Result<SecretValue, Invalid> {
        if value.len() > MAX_SECRET {
            return Err(invalid(format!(
                "secret {path}: {} bytes, more than {MAX_SECRET}",
                value.len()
            )));
        }
        Ok(SecretValue(value))
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretValue({} bytes)", self.0.len())
    }
}

/// The secret files a retain request keeps.
pub fn check_secret_files(keep: &[wire::SecretFile]) -> Result<BTreeSet<SecretPath>, Invalid> {
    if keep.len() > MAX_SECRET_FILES {
        return Err(invalid(format!(
            "{} secret files, more than {MAX_SECRET_FILES}",
            keep.len()
        )));
    }
    keep.iter()
        .map(|k| SecretPath::parse(&k.allocation_id, &k.file))
        .collect()
}

/// One allocation's env file, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvFile {
    allocation: AllocationId,
    devices: Vec<String>,
    env: BTreeMap<String, String>,
}

impl EnvFile {
    pub fn parse(m: wire::WriteEnvFile) -> Result<EnvFile, Invalid> {
        let allocation = AllocationId::parse(&m.allocation_id)?;
        if m.devices.is_empty() {
            return Err(invalid(format!(
                "allocation {allocation}: name at least one GPU"
            )));
        }
        if m.devices.len() > MAX_DEVICES {
            return Err(invalid(format!(
                "allocation {allocation}: {} GPUs, more than {MAX_DEVICES}",
                m.devices.len()
            )));
        }
        let mut seen = BTreeSet::new();
        for d in &m.devices {
            check_device_name(d).map_err(|e| invalid(format!("allocation {allocation}: {e}")))?;
            if !seen.insert(d.as_str()) {
                return Err(invalid(format!(
                    "allocation {allocation}: GPU {d} appears twice"
                )));
            }
        }
        if m.env.len() > MAX_ENV {
            return Err(invalid(format!(
                "allocation {allocation}: {} variables, more than {MAX_ENV}",
                m.env.len()
            )));
        }
        for (k, v) in &m.env {
            check_env_key(k).map_err(|e| invalid(format!("allocation {allocation}: {e}")))?;
            check_env_value(k, v).map_err(|e| invalid(format!("allocation {allocation}: {e}")))?;
        }
        Ok(EnvFile {
            allocation,
            devices: m.devices,
            env: m.env,
        })
    }

    pub fn allocation(&self) -> &AllocationId {
        &self.allocation
    }

    pub fn devices(&self) -> &[String] {
        &self.devices
    }

    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// The file's bytes: the same the agent's devices converger writes
    /// when it runs as root.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::from("# Written by bcd from the node's spec; edits are undone.\n");
        let _ = writeln!(s, "NVIDIA_VISIBLE_DEVICES={}", self.devices.join(","));
        let cdi: Vec<String> = self
            .devices
            .iter()
            .map(|n| format!("{}={n}", cdi::nvidia::KIND))
            .collect();
        let _ = writeln!(s, "CDI_DEVICES={}", cdi.join(","));
        for (k, v) in &self.env {
            let _ = writeln!(s, "{k}={v}");
        }
        s
    }

    pub fn to_wire(&self) -> wire::WriteEnvFile {
        wire::WriteEnvFile {
            allocation_id: self.allocation.0.clone(),
            devices: self.devices.clone(),
            env: self.env.clone(),
        }
    }
}

/// A CDI spec the helper may write: valid by the `cdi` crate, of kind
/// `nvidia.com/gpu`, and acting on nothing but NVIDIA device nodes and
/// read-only bind mounts of the same host path. Hooks (which the container
/// runtime runs on the host) and every other edit are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiSpec {
    json: Vec<u8>,
    spec: cdi::Spec,
}

fn clean_absolute(what: &str, p: &str) -> Result<(), Invalid> {
    if !p.starts_with('/') || p.split('/').any(|c| c == ".." || c == ".") {
        return Err(invalid(format!(
            "CDI spec: {what} {} must be an absolute path without '.' or '..'",
            shown(p)
        )));
    }
    Ok(())
}

fn check_edits(edits: &cdi::ContainerEdits) -> Result<(), Invalid> {
    if !edits.hooks.is_empty() {
        return Err(invalid(
            "CDI spec: hooks are refused (the container runtime would run them on the host)",
        ));
    }
    if edits.intel_rdt.is_some() || !edits.net_devices.is_empty() {
        return Err(invalid(
            "CDI spec: Intel RDT and network devices are not GPU edits",
        ));
    }
    if !edits.additional_gids.is_empty() {
        return Err(invalid("CDI spec: additional groups are refused"));
    }
    for n in &edits.device_nodes {
        clean_absolute("device node", &n.path)?;
        if !n.path.starts_with("/dev/nvidia") {
            return Err(invalid(format!(
                "CDI spec: device node {} is not an NVIDIA device (/dev/nvidia*)",
                shown(&n.path)
            )));
        }
        if !n.host_path.is_empty() && n.host_path != n.path {
            return Err(invalid(format!(
                "CDI spec: device node {} must come from the same host path",
                shown(&n.path)
            )));
        }
    }
    for m in &edits.mounts {
        clean_absolute("mount", &m.host_path)?;
        if m.container_path != m.host_path {
            return Err(invalid(format!(
                "CDI spec: mount {} must be mounted at the same path",
                shown(&m.host_path)
            )));
        }
        if !matches!(m.kind.as_str(), "" | "bind") {
            return Err(invalid(format!(
                "CDI spec: mount {} has type {}: only bind mounts",
                shown(&m.host_path),
                shown(&m.kind)
            )));
        }
        if !m.options.iter().any(|o| o == "ro") || m.options.iter().any(|o| o == "rw") {
            return Err(invalid(format!(
                "CDI spec: mount {} must be read-only",
                shown(&m.host_path)
            )));
        }
    }
    Ok(())
}

impl CdiSpec {
    pub fn parse(json: Vec<u8>) -> Result<CdiSpec, Invalid> {
        if json.len() > MAX_CDI_SPEC {
            return Err(invalid(format!(
                "the CDI spec has {} bytes, more than {MAX_CDI_SPEC}",
                json.len()
            )));
        }
        let spec = cdi::Spec::parse(&json).map_err(|e| invalid(format!("CDI spec: {e}")))?;
        if spec.kind != cdi::nvidia::KIND {
            return Err(invalid(format!(
                "CDI spec: kind {} is not {}",
                shown(&spec.kind),
                cdi::nvidia::KIND
            )));
        }
        check_edits(&spec.container_edits)?;
        for d in &spec.devices {
            check_edits(&d.container_edits)
                .map_err(|e| invalid(format!("{e} (device {})", shown(&d.name))))?;
        }
        Ok(CdiSpec { json, spec })
    }

    /// The bytes to write, exactly as sent.
    pub fn json(&self) -> &[u8] {
        &self.json
    }

    pub fn spec(&self) -> &cdi::Spec {
        &self.spec
    }
}

const KEY_TYPES: &[&str] = &[
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
];

/// An authorized_keys line: a known type, base64 that decodes to an SSH
/// public key blob of that same type, an optional comment, no options, no
/// control characters, bounded.
pub fn check_key(line: &str) -> Result<(), Invalid> {
    use base64::Engine;
    if line.len() > MAX_KEY_LINE {
        return Err(invalid(format!(
            "a key line has {} bytes, more than {MAX_KEY_LINE}",
            line.len()
        )));
    }
    if line.chars().any(|c| c.is_control()) {
        return Err(invalid("a key must be one line without control characters"));
    }
    let mut parts = line.split_whitespace();
    let (Some(kind), Some(b64)) = (parts.next(), parts.next()) else {
        return Err(invalid(format!(
            "{} is not TYPE BASE64 [COMMENT]",
            shown(line)
        )));
    };
    if !KEY_TYPES.contains(&kind) {
        return Err(invalid(format!(
            "key type {} is not one sshd accepts here",
            shown(kind)
        )));
    }
    let blob = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| invalid(format!("the {kind} key is not valid base64")))?;
    let len = blob
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or_else(|| invalid("the key blob is truncated"))?;
    if blob.get(4..4usize.saturating_add(len)) != Some(kind.as_bytes()) {
        return Err(invalid(format!("the key blob is not a {kind} key")));
    }
    Ok(())
}

/// A user name sshd and the system accept: `[a-z_][a-z0-9_-]{0,31}`.
pub fn check_user(name: &str) -> Result<(), Invalid> {
    let ok = name.len() <= 32
        && name
            .bytes()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == b'_')
        && name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-');
    if ok {
        Ok(())
    } else {
        Err(invalid(format!("{} is not a valid user name", shown(name))))
    }
}

/// A certificate principal: one word, no commas, no control characters.
pub fn check_principal(p: &str) -> Result<(), Invalid> {
    if p.is_empty()
        || p.len() > MAX_PRINCIPAL
        || p.contains(|c: char| c.is_whitespace() || c.is_control() || c == ',')
    {
        return Err(invalid(format!(
            "principal {} must be one word of at most {MAX_PRINCIPAL} bytes",
            shown(p)
        )));
    }
    Ok(())
}

/// One sshd user, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshUser {
    name: String,
    authorized_keys: Vec<String>,
    principals: Vec<String>,
}

impl SshUser {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn authorized_keys(&self) -> &[String] {
        &self.authorized_keys
    }

    pub fn principals(&self) -> &[String] {
        &self.principals
    }
}

/// The sshd files, checked. Empty (no user, no CA key): remove them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshdFiles {
    users: Vec<SshUser>,
    trusted_user_ca_keys: Vec<String>,
}

impl SshdFiles {
    pub fn parse(m: wire::WriteSshd) -> Result<SshdFiles, Invalid> {
        if m.users.len() > MAX_USERS {
            return Err(invalid(format!(
                "{} sshd users, more than {MAX_USERS}",
                m.users.len()
            )));
        }
        if m.trusted_user_ca_keys.len() > MAX_CA_KEYS {
            return Err(invalid(format!(
                "{} trusted user CA keys, more than {MAX_CA_KEYS}",
                m.trusted_user_ca_keys.len()
            )));
        }
        let mut names = BTreeSet::new();
        let mut users = Vec::with_capacity(m.users.len());
        for u in m.users {
            check_user(&u.name)?;
            if !names.insert(u.name.clone()) {
                return Err(invalid(format!("user {} appears twice", u.name)));
            }
            if u.authorized_keys.len() > MAX_KEYS_PER_USER {
                return Err(invalid(format!(
                    "user {}: {} keys, more than {MAX_KEYS_PER_USER}",
                    u.name,
                    u.authorized_keys.len()
                )));
            }
            if u.principals.len() > MAX_PRINCIPALS_PER_USER {
                return Err(invalid(format!(
                    "user {}: {} principals, more than {MAX_PRINCIPALS_PER_USER}",
                    u.name,
                    u.principals.len()
                )));
            }
            for k in &u.authorized_keys {
                check_key(k).map_err(|e| invalid(format!("user {}: {e}", u.name)))?;
            }
            for p in &u.principals {
                check_principal(p).map_err(|e| invalid(format!("user {}: {e}", u.name)))?;
            }
            users.push(SshUser {
                name: u.name,
                authorized_keys: u.authorized_keys,
                principals: u.principals,
            });
        }
        for k in &m.trusted_user_ca_keys {
            check_key(k).map_err(|e| invalid(format!("trusted user CA key: {e}")))?;
        }
        Ok(SshdFiles {
            users,
            trusted_user_ca_keys: m.trusted_user_ca_keys,
        })
    }

    pub fn users(&self) -> &[SshUser] {
        &self.users
    }

    pub fn trusted_user_ca_keys(&self) -> &[String] {
        &self.trusted_user_ca_keys
    }

    /// No user and no CA key: the sshd files are to be removed.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty() && self.trusted_user_ca_keys.is_empty()
    }

    pub fn to_wire(&self) -> wire::WriteSshd {
        wire::WriteSshd {
            users: self
                .users
                .iter()
                .map(|u| wire::SshUser {
                    name: u.name.clone(),
                    authorized_keys: u.authorized_keys.clone(),
                    principals: u.principals.clone(),
                })
                .collect(),
            trusted_user_ca_keys: self.trusted_user_ca_keys.clone(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    /// As nft and the spec name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Accept,
    Drop,
}

impl Action {
    /// As nft and the spec name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Accept => "accept",
            Action::Drop => "drop",
        }
    }
}

/// A rule's source: an address, or a network with its prefix length.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Source {
    text: String,
    addr: IpAddr,
    prefix: Option<u8>,
}

impl Source {
    pub fn parse(s: &str) -> Result<Source, Invalid> {
        let bad = || {
            invalid(format!(
                "rule source {} is not an address or CIDR",
                shown(s)
            ))
        };
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match len {
            None => None,
            Some(l) => {
                let digits = !l.is_empty() && l.len() <= 3 && l.bytes().all(|b| b.is_ascii_digit());
                let l: u8 = l
                    .parse()
                    .ok()
                    .filter(|l| digits && *l <= max)
                    .ok_or_else(|| {
                        invalid(format!("rule source {} has a bad prefix length", shown(s)))
                    })?;
                Some(l)
            }
        };
        Ok(Source {
            text: s.to_string(),
            addr,
            prefix,
        })
    }

    /// The text as sent (what the rule's comment is made of).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    pub fn prefix(&self) -> Option<u8> {
        self.prefix
    }
}

/// One rule of table `inet bcd`, typed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FirewallRule {
    pub protocol: Protocol,
    pub port: u16,
    pub source: Option<Source>,
    pub action: Action,
}

impl FirewallRule {
    pub fn parse(r: &wire::FirewallRule) -> Result<FirewallRule, Invalid> {
        let protocol = match wire::Protocol::try_from(r.protocol) {
            Ok(wire::Protocol::Tcp) => Protocol::Tcp,
            Ok(wire::Protocol::Udp) => Protocol::Udp,
            _ => {
                return Err(invalid(format!(
                    "rule protocol {} must be tcp or udp",
                    r.protocol
                )));
            }
        };
        let port = u16::try_from(r.port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| invalid(format!("rule port {} is not a port", r.port)))?;
        let action = match wire::Action::try_from(r.action) {
            Ok(wire::Action::Accept) => Action::Accept,
            Ok(wire::Action::Drop) => Action::Drop,
            _ => {
                return Err(invalid(format!(
                    "rule action {} must be accept or drop",
                    r.action
                )));
            }
        };
        let source = if r.source.is_empty() {
            None
        } else {
            Some(Source::parse(&r.source)?)
        };
        Ok(FirewallRule {
            protocol,
            port,
            source,
            action,
        })
    }

    pub fn to_wire(&self) -> wire::FirewallRule {
        wire::FirewallRule {
            protocol: match self.protocol {
                Protocol::Tcp => wire::Protocol::Tcp,
                Protocol::Udp => wire::Protocol::Udp,
            } as i32,
            port: u32::from(self.port),
            source: self
                .source
                .as_ref()
                .map(|s| s.text.clone())
                .unwrap_or_default(),
            action: match self.action {
                Action::Accept => wire::Action::Accept,
                Action::Drop => wire::Action::Drop,
            } as i32,
        }
    }
}

/// The rules of table `inet bcd`, in order.
pub fn check_firewall(rules: &[wire::FirewallRule]) -> Result<Vec<FirewallRule>, Invalid> {
    if rules.len() > MAX_RULES {
        return Err(invalid(format!(
            "{} firewall rules, more than {MAX_RULES}",
            rules.len()
        )));
    }
    rules
        .iter()
        .enumerate()
        .map(|(i, r)| FirewallRule::parse(r).map_err(|e| invalid(format!("rule {}: {e}", i + 1))))
        .collect()
}

/// A PCI function's address as sysfs names it: `DDDD:BB:DD.F` in lowercase
/// hex (a domain of 4 to 8 digits: VMD domains have 5).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress(String);

impl PciAddress {
    pub fn parse(s: &str) -> Result<PciAddress, Invalid> {
        let hex = |p: &str, min: usize, max: usize| {
            p.len() >= min
                && p.len() <= max
                && p.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let ok = (|| {
            let (domain, rest) = s.split_once(':')?;
            let (bus, rest) = rest.split_once(':')?;
            let (device, function) = rest.split_once('.')?;
            let device_ok = hex(device, 2, 2) && u8::from_str_radix(device, 16).ok()? <= 0x1f;
            let function_ok = function.len() == 1 && matches!(function.as_bytes()[0], b'0'..=b'7');
            Some(hex(domain, 4, 8) && hex(bus, 2, 2) && device_ok && function_ok)
        })()
        .unwrap_or(false);
        if ok {
            Ok(PciAddress(s.to_string()))
        } else {
            Err(invalid(format!(
                "{} is not a PCI address like 0000:3b:00.0",
                shown(s)
            )))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The PCI function at `address` under `sysfs` (`/sys`) is an NVIDIA GPU:
/// vendor 0x10de, class VGA (0x0300) or 3D controller (0x0302), as the
/// agent's inventory counts GPUs.
pub fn check_gpu(sysfs: &Path, address: &PciAddress) -> Result<(), Invalid> {
    let dir = sysfs.join("bus/pci/devices").join(address.as_str());
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).map(|s| s.trim().to_string());
    let vendor = read("vendor")
        .map_err(|_| invalid(format!("no PCI device {address} under {}", sysfs.display())))?;
    let class = read("class").unwrap_or_default();
    if vendor != "0x10de" || !(class.starts_with("0x0300") || class.starts_with("0x0302")) {
        return Err(invalid(format!(
            "PCI device {address} is not an NVIDIA GPU (vendor {}, class {})",
            shown(&vendor),
            shown(&class)
        )));
    }
    Ok(())
}

/// A file in the helper's staging directory, by name (never a path).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StagedFile(String);

impl StagedFile {
    pub fn parse(s: &str) -> Result<StagedFile, Invalid> {
        check_file_name("staged file", s, MAX_FILE_NAME)?;
        Ok(StagedFile(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StagedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A SHA-256 digest.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sha256(pub [u8; 32]);

impl Sha256 {
    pub fn parse(what: &str, bytes: &[u8]) -> Result<Sha256, Invalid> {
        <[u8; 32]>::try_from(bytes).map(Sha256).map_err(|_| {
            invalid(format!(
                "the SHA-256 of {what} has {} bytes, not 32",
                bytes.len()
            ))
        })
    }
}

impl fmt::Display for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256({self})")
    }
}

/// An A/B slot of the self-update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    A,
    B,
}

impl Slot {
    pub fn parse(v: i32) -> Result<Slot, Invalid> {
        match wire::Slot::try_from(v) {
            Ok(wire::Slot::A) => Ok(Slot::A),
            Ok(wire::Slot::B) => Ok(Slot::B),
            _ => Err(invalid(format!("slot {v} must be a or b"))),
        }
    }

    /// The slot's directory name: `a` or `b`.
    pub fn name(self) -> &'static str {
        match self {
            Slot::A => "a",
            Slot::B => "b",
        }
    }

    pub fn to_wire(self) -> i32 {
        match self {
            Slot::A => wire::Slot::A as i32,
            Slot::B => wire::Slot::B as i32,
        }
    }
}

/// A kernel command line: printable ASCII, bounded.
pub fn check_cmdline(s: &str) -> Result<(), Invalid> {
    if s.len() > MAX_CMDLINE {
        return Err(invalid(format!(
            "the kernel command line has {} bytes, more than {MAX_CMDLINE}",
            s.len()
        )));
    }
    if !s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(invalid(
            "the kernel command line must be printable ASCII on one line",
        ));
    }
    Ok(())
}

/// A reason for the log: printable, bounded.
pub fn check_reason(s: &str) -> Result<(), Invalid> {
    if s.len() > MAX_REASON || s.chars().any(|c| c.is_control()) {
        return Err(invalid(format!(
            "the reason must be one line of at most {MAX_REASON} bytes"
        )));
    }
    Ok(())
}

/// A kexec, checked: the kernel and initrd are staged files with their
/// digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kexec {
    pub kernel: StagedFile,
    pub kernel_sha256: Sha256,
    pub initrd: Option<(StagedFile, Sha256)>,
    pub cmdline: String,
}

impl Kexec {
    pub fn parse(m: wire::Kexec) -> Result<Kexec, Invalid> {
        let kernel = StagedFile::parse(&m.kernel).map_err(|e| invalid(format!("kernel: {e}")))?;
        let kernel_sha256 = Sha256::parse("the kernel", &m.kernel_sha256)?;
        let initrd = match (m.initrd.is_empty(), m.initrd_sha256.is_empty()) {
            (true, true) => None,
            (false, _) => Some((
                StagedFile::parse(&m.initrd).map_err(|e| invalid(format!("initrd: {e}")))?,
                Sha256::parse("the initrd", &m.initrd_sha256)?,
            )),
            (true, false) => {
                return Err(invalid("an initrd digest without an initrd"));
            }
        };
        check_cmdline(&m.cmdline)?;
        Ok(Kexec {
            kernel,
            kernel_sha256,
            initrd,
            cmdline: m.cmdline,
        })
    }

    pub fn to_wire(&self) -> wire::Kexec {
        let (initrd, initrd_sha256) = match &self.initrd {
            Some((f, h)) => (f.0.clone(), h.0.to_vec()),
            None => (String::new(), Vec::new()),
        };
        wire::Kexec {
            kernel: self.kernel.0.clone(),
            kernel_sha256: self.kernel_sha256.0.to_vec(),
            initrd,
            initrd_sha256,
            cmdline: self.cmdline.clone(),
        }
    }
}

/// The TPM 2.0 commands the attestor (`bcd/tpm`, the pure-Rust backend)
/// sends, by command code: nothing else is relayed. TPM2_Clear,
/// NV_Write, EvictControl, HierarchyChangeAuth, PCR_Extend and the rest
/// never reach the TPM through the helper.
pub const TPM_COMMANDS: &[(u32, &str)] = &[
    (0x0000_0131, "TPM2_CreatePrimary"),
    (0x0000_0147, "TPM2_ActivateCredential"),
    (0x0000_0148, "TPM2_Certify"),
    (0x0000_014E, "TPM2_NV_Read"),
    (0x0000_0151, "TPM2_PolicySecret"),
    (0x0000_015D, "TPM2_Sign"),
    (0x0000_0165, "TPM2_FlushContext"),
    (0x0000_0169, "TPM2_NV_ReadPublic"),
    (0x0000_0173, "TPM2_ReadPublic"),
    (0x0000_0176, "TPM2_StartAuthSession"),
];

/// The hierarchies the attestor makes primary keys under: owner (the node
/// key) and endorsement (the EK and the AK).
pub const TPM_PRIMARY_HIERARCHIES: &[u32] = &[0x4000_0001, 0x4000_000B];

const TPM_ST_NO_SESSIONS: u16 = 0x8001;
const TPM_ST_SESSIONS: u16 = 0x8002;
const TPM_CC_CREATE_PRIMARY: u32 = 0x0000_0131;

/// A TPM 2.0 command, checked: a whole command (tag, size, code) of an
/// allowed code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmCommand {
    bytes: Vec<u8>,
    code: u32,
    name: &'static str,
}

impl TpmCommand {
    pub fn parse(bytes: Vec<u8>) -> Result<TpmCommand, Invalid> {
        if bytes.len() < 10 || bytes.len() > MAX_TPM_COMMAND {
            return Err(invalid(format!(
                "a TPM command of {} bytes: a command is 10 to {MAX_TPM_COMMAND} bytes",
                bytes.len()
            )));
        }
        let tag = u16::from_be_bytes([bytes[0], bytes[1]]);
        let size = u32::from_be_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]) as usize;
        let code = u32::from_be_bytes([bytes[6], bytes[7], bytes[8], bytes[9]]);
        if tag != TPM_ST_NO_SESSIONS && tag != TPM_ST_SESSIONS {
            return Err(invalid(format!(
                "TPM command tag {tag:#06x} is not TPM_ST_NO_SESSIONS or TPM_ST_SESSIONS"
            )));
        }
        if size != bytes.len() {
            return Err(invalid(format!(
                "the TPM command's header says {size} bytes; it has {}",
                bytes.len()
            )));
        }
        let Some((_, name)) = TPM_COMMANDS.iter().find(|(c, _)| *c == code) else {
            return Err(invalid(format!(
                "TPM command code {code:#010x} is not one bcd sends"
            )));
        };
        if code == TPM_CC_CREATE_PRIMARY {
            let hierarchy = bytes
                .get(10..14)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or_else(|| invalid("TPM2_CreatePrimary without its hierarchy"))?;
            if !TPM_PRIMARY_HIERARCHIES.contains(&hierarchy) {
                return Err(invalid(format!(
                    "TPM2_CreatePrimary under hierarchy {hierarchy:#010x}: bcd makes keys under owner and endorsement only"
                )));
            }
        }
        Ok(TpmCommand { bytes, code, name })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    pub fn code(&self) -> u32 {
        self.code
    }

    /// The command's name, for the log: `TPM2_Sign`.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

#[cfg(test)]
mod tests;
