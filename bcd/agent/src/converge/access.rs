//! The access converger: sshd's view of who may log in, and the node's own
//! nftables table.
//!
//! sshd reads what we write under `<etc>/ssh/bcd/`: an authorized_keys file
//! and a principals file per user, and the trusted user CA keys, wired in by
//! `<etc>/ssh/sshd_config.d/bcd.conf`. Keys and user names are checked
//! before anything is written, and the configuration is checked by
//! `sshd -t` when sshd is installed. The firewall is one table, `inet bcd`,
//! replaced atomically in one `nft` transaction (JSON through the nftables
//! crate); no other table is touched, and the table is deleted when the spec
//! drops it. Every rule carries a comment naming its content, so a pass can
//! tell an unchanged table from one that drifted.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use bcd_proto::typed::Spelling;
use bcd_proto::v1::{self, AccessSpec, FirewallRule, FirewallSpec};
use nftables::{batch::Batch, expr, schema, stmt, types};

use super::{Outcome, Status};

pub const TABLE: &str = "bcd";
const CHAIN: &str = "input";

/// A failed step: `Failed` when the spec cannot be applied as it is,
/// `Progressing` when the machine did not take it (retried).
pub type StepError = (Status, String);

/// sshd's files under one `/etc`.
#[derive(Debug, Clone)]
pub struct SshdDirs {
    /// `/etc` normally; tests use a directory of their own.
    pub etc_dir: PathBuf,
    /// The `sshd` program used for `sshd -t`; skipped when it is missing.
    pub sshd: PathBuf,
}

impl SshdDirs {
    fn bcd_dir(&self) -> PathBuf {
        self.etc_dir.join("ssh/bcd")
    }
    fn conf(&self) -> PathBuf {
        self.etc_dir.join("ssh/sshd_config.d/bcd.conf")
    }
}

/// One user's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshdUser {
    pub name: String,
    /// The authorized_keys file, one key a line.
    pub authorized_keys: String,
    /// The principals file, one principal a line.
    pub principals: String,
}

/// What sshd's files must hold: every name and key checked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SshdPlan {
    pub users: Vec<SshdUser>,
    /// The trusted user CA keys file, one key a line.
    pub trusted_user_ca_keys: String,
}

impl SshdPlan {
    /// Whether bcd's sshd configuration is wanted at all.
    pub fn in_use(&self) -> bool {
        !self.users.is_empty() || !self.trusted_user_ca_keys.is_empty()
    }
}

/// Writes sshd's files (a privileged act: they are root's and sshd trusts
/// them).
pub trait SshdFiles: Send + Sync + std::fmt::Debug {
    /// Makes the files what `plan` says (checked by `sshd -t` first),
    /// removing bcd's files of users it does not name, or all of them when
    /// it is not in use; says whether anything changed.
    fn apply(&self, plan: &SshdPlan) -> Result<bool, StepError>;
}

/// Replaces or removes the node's own nftables table, `inet bcd` (a
/// privileged act: CAP_NET_ADMIN).
pub trait Firewall: Send + Sync + std::fmt::Debug {
    /// Makes the table hold exactly `rules` (checked already), in one
    /// transaction; `None` removes the table. Says whether anything changed.
    fn apply(&self, rules: Option<&[FirewallRule]>) -> Result<bool, StepError>;
}

/// The table through the `nft` program.
#[derive(Debug, Clone)]
pub struct Nft {
    /// The `nft` program (a wrapper can run it in another namespace).
    pub nft: PathBuf,
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

/// Checks an authorized_keys line: a known type, base64 that decodes to an
/// SSH public key blob of that same type, an optional comment, no options
/// and no line breaks.
pub fn check_key(line: &str) -> Result<(), String> {
    use base64::Engine;
    if line.contains(['\n', '\r']) {
        return Err("a key must be one line".into());
    }
    let mut parts = line.split_whitespace();
    let (Some(kind), Some(b64)) = (parts.next(), parts.next()) else {
        return Err(format!("{line:?} is not TYPE BASE64 [COMMENT]"));
    };
    if !KEY_TYPES.contains(&kind) {
        return Err(format!("key type {kind:?} is not one sshd accepts here"));
    }
    let blob = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| format!("the {kind} key is not valid base64"))?;
    let len = blob
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or("the key blob is truncated")?;
    if blob.get(4..4 + len) != Some(kind.as_bytes()) {
        return Err(format!("the key blob is not a {kind} key"));
    }
    Ok(())
}

/// A user name sshd and the system accept: `[a-z_][a-z0-9_-]{0,31}`.
pub fn check_user(name: &str) -> Result<(), String> {
    let ok = name.len() <= 32
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!("{name:?} is not a valid user name"))
    }
}

fn check_principal(p: &str) -> Result<(), String> {
    if p.is_empty() || p.contains(|c: char| c.is_whitespace() || c == ',') {
        return Err(format!("principal {p:?} must be one word"));
    }
    Ok(())
}

fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<bool, String> {
    bcd_sys::fs::write_if_changed(path, bytes, 0o644).map_err(|e| bcd_sys::error::chain(&e))
}

fn remove_others(dir: &Path, keep: &BTreeSet<String>) -> Result<bool, String> {
    let mut changed = false;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if !keep.contains(&name) {
                std::fs::remove_file(e.path())
                    .map_err(|err| format!("cannot remove {}: {err}", e.path().display()))?;
                changed = true;
            }
        }
    }
    Ok(changed)
}

pub(crate) fn sshd_conf(p: &SshdDirs) -> String {
    let dir = p.bcd_dir();
    format!(
        "# Written by bcd from the node's spec; edits are undone.\n\
         AuthorizedKeysFile .ssh/authorized_keys {}/authorized_keys/%u\n\
         AuthorizedPrincipalsFile {}/principals/%u\n\
         TrustedUserCAKeys {}/trusted_user_ca_keys\n",
        dir.display(),
        dir.display(),
        dir.display()
    )
}

/// `sshd -t` on a configuration made of ours and a host key, so a
/// directive sshd refuses never reaches the live configuration.
pub(crate) fn sshd_check(p: &SshdDirs, conf: &str) -> Result<(), String> {
    if !p.sshd.exists() {
        return Ok(());
    }
    // sshd -t wants its privilege separation directory, which its service
    // normally creates.
    let _ = std::fs::create_dir_all("/run/sshd");
    let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    let host_key = p.etc_dir.join("ssh/ssh_host_ed25519_key");
    let key = if host_key.exists() {
        host_key
    } else {
        let k = dir.path().join("host_key");
        let out = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&k)
            .output()
            .map_err(|e| format!("ssh-keygen for the sshd -t check: {e}"))?;
        if !out.status.success() {
            return Err("ssh-keygen failed for the sshd -t check".into());
        }
        k
    };
    let cfg = dir.path().join("sshd_config");
    std::fs::write(&cfg, format!("HostKey {}\n{conf}", key.display()))
        .map_err(|e| format!("sshd -t config: {e}"))?;
    let out = std::process::Command::new(&p.sshd)
        .arg("-t")
        .arg("-f")
        .arg(&cfg)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", p.sshd.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "sshd -t refuses the configuration: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Checks every user name, key and principal and computes sshd's files.
pub fn sshd_plan(spec: &AccessSpec) -> Result<SshdPlan, String> {
    let mut names = BTreeSet::new();
    let mut users = Vec::new();
    for u in &spec.users {
        check_user(&u.name)?;
        if !names.insert(u.name.clone()) {
            return Err(format!("user {} appears twice", u.name));
        }
        for k in &u.authorized_keys {
            check_key(k).map_err(|e| format!("user {}: {e}", u.name))?;
        }
        for pr in &u.principals {
            check_principal(pr).map_err(|e| format!("user {}: {e}", u.name))?;
        }
        users.push(SshdUser {
            name: u.name.clone(),
            authorized_keys: u.authorized_keys.iter().map(|k| format!("{k}\n")).collect(),
            principals: u.principals.iter().map(|k| format!("{k}\n")).collect(),
        });
    }
    for k in &spec.trusted_user_ca_keys {
        check_key(k).map_err(|e| format!("trusted user CA key: {e}"))?;
    }
    Ok(SshdPlan {
        users,
        trusted_user_ca_keys: spec
            .trusted_user_ca_keys
            .iter()
            .map(|k| format!("{k}\n"))
            .collect(),
    })
}

impl SshdFiles for SshdDirs {
    fn apply(&self, plan: &SshdPlan) -> Result<bool, StepError> {
        let failed = |m: String| (Status::Failed, m);
        let progressing = |m: String| (Status::Progressing, m);
        let dir = self.bcd_dir();
        let mut changed = false;
        if !plan.in_use() {
            for path in [self.conf(), dir.join("trusted_user_ca_keys")] {
                changed |= bcd_sys::fs::remove_if_present(&path)
                    .map_err(|e| progressing(bcd_sys::error::chain(&e)))?;
            }
            for sub in ["authorized_keys", "principals"] {
                changed |=
                    remove_others(&dir.join(sub), &Default::default()).map_err(progressing)?;
            }
            return Ok(changed);
        }
        let conf = sshd_conf(self);
        sshd_check(self, &conf).map_err(failed)?;
        let mut keep = BTreeSet::new();
        for u in &plan.users {
            keep.insert(u.name.clone());
            changed |= write_if_changed(
                &dir.join("authorized_keys").join(&u.name),
                u.authorized_keys.as_bytes(),
            )
            .map_err(progressing)?;
            changed |= write_if_changed(
                &dir.join("principals").join(&u.name),
                u.principals.as_bytes(),
            )
            .map_err(progressing)?;
        }
        for sub in ["authorized_keys", "principals"] {
            changed |= remove_others(&dir.join(sub), &keep).map_err(progressing)?;
        }
        changed |= write_if_changed(
            &dir.join("trusted_user_ca_keys"),
            plan.trusted_user_ca_keys.as_bytes(),
        )
        .map_err(progressing)?;
        changed |= write_if_changed(&self.conf(), conf.as_bytes()).map_err(progressing)?;
        Ok(changed)
    }
}

/// One pass over the sshd files: the plan, then the files.
pub fn sshd(files: &dyn SshdFiles, spec: &AccessSpec) -> Result<bool, StepError> {
    let plan = sshd_plan(spec).map_err(|m| (Status::Failed, m))?;
    files.apply(&plan)
}

/// The rule's protocol, if it names one this node knows.
fn protocol(r: &FirewallRule) -> Option<v1::FirewallProtocol> {
    match v1::FirewallProtocol::try_from(r.protocol).ok()? {
        v1::FirewallProtocol::Unspecified => None,
        p @ (v1::FirewallProtocol::Tcp | v1::FirewallProtocol::Udp) => Some(p),
    }
}

/// The rule's action, if it names one this node knows.
fn action(r: &FirewallRule) -> Option<v1::FirewallAction> {
    match v1::FirewallAction::try_from(r.action).ok()? {
        v1::FirewallAction::Unspecified => None,
        a @ (v1::FirewallAction::Accept | v1::FirewallAction::Drop) => Some(a),
    }
}

/// Names the rule's content (its spelling, as before enums: a node that
/// upgrades does not see its own rules as drift).
pub(crate) fn rule_comment(r: &FirewallRule) -> String {
    let p = protocol(r).map_or("unspecified", Spelling::spelling);
    let a = action(r).map_or("unspecified", Spelling::spelling);
    let text = format!("{p}|{}|{}|{a}", r.port, r.source);
    format!("bcd:{}", &bcd_proto::fingerprint(text.as_bytes())[..16])
}

fn check_rule(r: &FirewallRule) -> Result<(), String> {
    if protocol(r).is_none() {
        return Err(format!("rule protocol {} must be tcp or udp", r.protocol));
    }
    if r.port == 0 || r.port > 65535 {
        return Err(format!("rule port {} is not a port", r.port));
    }
    if action(r).is_none() {
        return Err(format!("rule action {} must be accept or drop", r.action));
    }
    if !r.source.is_empty() {
        let (addr, len) = match r.source.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (r.source.as_str(), None),
        };
        let ip: std::net::IpAddr = addr
            .parse()
            .map_err(|_| format!("rule source {:?} is not an address or CIDR", r.source))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        if let Some(l) = len {
            let l: u32 = l
                .parse()
                .map_err(|_| format!("rule source {:?} has a bad prefix length", r.source))?;
            if l > max {
                return Err(format!(
                    "rule source {:?} has a bad prefix length",
                    r.source
                ));
            }
        }
    }
    Ok(())
}

fn rule_stmts(r: &FirewallRule) -> Vec<stmt::Statement<'static>> {
    let field = |protocol: &str, field: &str| {
        expr::Expression::Named(expr::NamedExpression::Payload(expr::Payload::PayloadField(
            expr::PayloadField {
                protocol: protocol.to_string().into(),
                field: field.to_string().into(),
            },
        )))
    };
    let mut s = Vec::new();
    if !r.source.is_empty() {
        let (addr, len) = match r.source.split_once('/') {
            Some((a, l)) => (a.to_string(), l.parse::<u32>().ok()),
            None => (r.source.clone(), None),
        };
        let family = if addr.contains(':') { "ip6" } else { "ip" };
        let right = match len {
            Some(len) => expr::Expression::Named(expr::NamedExpression::Prefix(expr::Prefix {
                addr: Box::new(expr::Expression::String(addr.into())),
                len,
            })),
            None => expr::Expression::String(addr.into()),
        };
        s.push(stmt::Statement::Match(stmt::Match {
            left: field(family, "saddr"),
            right,
            op: stmt::Operator::EQ,
        }));
    }
    // Checked: only rules that name both are planned.
    let p = protocol(r).map_or("unspecified", Spelling::spelling);
    s.push(stmt::Statement::Match(stmt::Match {
        left: field(p, "dport"),
        right: expr::Expression::Number(r.port),
        op: stmt::Operator::EQ,
    }));
    s.push(match action(r) {
        Some(v1::FirewallAction::Accept) => stmt::Statement::Accept(None),
        Some(v1::FirewallAction::Drop | v1::FirewallAction::Unspecified) | None => {
            stmt::Statement::Drop(None)
        }
    });
    s
}

fn table() -> schema::Table<'static> {
    schema::Table {
        family: types::NfFamily::INet,
        name: TABLE.into(),
        ..Default::default()
    }
}

/// What `nft -j list` prints, as far as drift detection reads it: tables by
/// family and name, our chain's hook, and each rule's comment (the nftables
/// crate's full schema types are only needed, and only serialized, for the
/// ruleset we apply).
#[derive(Debug, serde::Deserialize)]
struct Listing {
    nftables: Vec<ListItem>,
}

/// One element of the listing: a table, a chain, a rule, or something
/// else (metainfo, sets), which has none of these.
#[derive(Debug, serde::Deserialize)]
struct ListItem {
    table: Option<ListedTable>,
    chain: Option<ListedChain>,
    rule: Option<ListedRule>,
}

#[derive(Debug, serde::Deserialize)]
struct ListedTable {
    family: String,
    name: String,
}

#[derive(Debug, serde::Deserialize)]
struct ListedChain {
    name: String,
    hook: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
struct ListedRule {
    comment: Option<String>,
}

/// The comments of the rules in our table, in order; `None` without a table.
pub(crate) fn current_rules(p: &Nft) -> Result<Option<Vec<String>>, String> {
    let out = std::process::Command::new(&p.nft)
        .args(["-j", "list", "tables"])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", p.nft.display()))?;
    if !out.status.success() {
        return Err(format!(
            "nft list tables: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    if !has_our_table(&out.stdout)? {
        return Ok(None);
    }
    let out = std::process::Command::new(&p.nft)
        .args(["-j", "list", "table", "inet", TABLE])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", p.nft.display()))?;
    if !out.status.success() {
        return Err(format!(
            "nft list table: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    rule_comments(&out.stdout).map(Some)
}

/// Whether `nft -j list tables` lists table `inet bcd`.
fn has_our_table(json: &[u8]) -> Result<bool, String> {
    let tables: Listing =
        serde_json::from_slice(json).map_err(|e| format!("nft list tables output: {e}"))?;
    Ok(tables
        .nftables
        .iter()
        .filter_map(|o| o.table.as_ref())
        .any(|t| t.name == TABLE && t.family == "inet"))
}

/// The rules' comments from `nft -j list table inet bcd`, in order, with a
/// marker when our chain is missing or hooked elsewhere: what a pass
/// compares with the rules it wants.
fn rule_comments(json: &[u8]) -> Result<Vec<String>, String> {
    let listed: Listing =
        serde_json::from_slice(json).map_err(|e| format!("nft list table output: {e}"))?;
    let mut chain_ok = false;
    let mut comments = Vec::new();
    for o in listed.nftables {
        if let Some(c) = o.chain.filter(|c| c.name == CHAIN) {
            chain_ok = c.hook.as_deref() == Some("input");
        }
        if let Some(r) = o.rule {
            comments.push(r.comment.unwrap_or_default());
        }
    }
    if !chain_ok {
        comments.push("<chain missing>".into());
    }
    Ok(comments)
}

/// Checks every rule before anything is applied.
pub fn check_rules(firewall: Option<&FirewallSpec>) -> Result<(), String> {
    firewall.map_or(Ok(()), |fw| fw.rules.iter().try_for_each(check_rule))
}

impl Firewall for Nft {
    fn apply(&self, rules: Option<&[FirewallRule]>) -> Result<bool, StepError> {
        let progressing = |m: String| (Status::Progressing, m);
        if rules.is_none()
            && std::process::Command::new(&self.nft)
                .arg("--version")
                .output()
                .is_err()
        {
            // No nft on this machine: there is no table of ours to remove.
            return Ok(false);
        }
        let current = current_rules(self).map_err(progressing)?;
        let mut batch = Batch::new();
        match (rules, current) {
            (None, None) => return Ok(false),
            (None, Some(_)) => batch.delete(schema::NfListObject::Table(table())),
            (Some(rules), current) => {
                let wanted: Vec<String> = rules.iter().map(rule_comment).collect();
                if current.as_ref() == Some(&wanted) {
                    return Ok(false);
                }
                // add + flush + fill, one transaction: the table is never
                // seen half-built.
                batch.add(schema::NfListObject::Table(table()));
                batch.add_cmd(schema::NfCmd::Flush(schema::FlushObject::Table(table())));
                batch.add(schema::NfListObject::Chain(schema::Chain {
                    family: types::NfFamily::INet,
                    table: TABLE.into(),
                    name: CHAIN.into(),
                    _type: Some(types::NfChainType::Filter),
                    hook: Some(types::NfHook::Input),
                    prio: Some(0),
                    policy: Some(types::NfChainPolicy::Accept),
                    ..Default::default()
                }));
                for r in rules {
                    batch.add(schema::NfListObject::Rule(schema::Rule {
                        family: types::NfFamily::INet,
                        table: TABLE.into(),
                        chain: CHAIN.into(),
                        expr: rule_stmts(r).into(),
                        comment: Some(rule_comment(r).into()),
                        ..Default::default()
                    }));
                }
            }
        }
        let ruleset = batch.to_nftables();
        nftables::helper::apply_ruleset_with_args(
            &ruleset,
            Some(&self.nft),
            nftables::helper::DEFAULT_ARGS,
        )
        .map_err(|e| (Status::Failed, format!("nft refused the table: {e}")))?;
        Ok(true)
    }
}

/// One pass over the firewall table: the rules checked, then applied.
pub fn firewall(fw: &dyn Firewall, spec: &AccessSpec) -> Result<bool, StepError> {
    check_rules(spec.firewall.as_ref()).map_err(|m| (Status::Failed, m))?;
    fw.apply(spec.firewall.as_ref().map(|f| f.rules.as_slice()))
}

/// One pass of the access converger: sshd's files, then the table.
pub fn converge(files: &dyn SshdFiles, fw: &dyn Firewall, spec: &AccessSpec) -> Outcome {
    let sshd_changed = match sshd(files, spec) {
        Ok(c) => c,
        Err((status, message)) => return Outcome::not(status, message),
    };
    match firewall(fw, spec) {
        Ok(c) => Outcome::ready(sshd_changed || c),
        Err((status, message)) => Outcome {
            status,
            message,
            changed: sshd_changed,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcd_proto::v1::AccessUser;

    // A real ed25519 public key (from ssh-keygen) and a real ECDSA one.
    const ED25519: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";

    fn keygen(dir: &Path, kind: &str) -> String {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let k = dir.join(format!("k-{kind}-{}", N.fetch_add(1, Ordering::Relaxed)));
        let out = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", kind, "-N", "", "-f"])
            .arg(&k)
            .output()
            .expect("ssh-keygen (openssh-client; scripts/test installs it)");
        assert!(out.status.success());
        std::fs::read_to_string(k.with_extension("pub"))
            .unwrap()
            .trim()
            .to_string()
    }

    #[test]
    fn keys_and_users_are_checked() {
        check_key(ED25519).unwrap();
        let d = tempfile::tempdir().unwrap();
        check_key(&keygen(d.path(), "ecdsa")).unwrap();
        check_key(&keygen(d.path(), "rsa")).unwrap();
        assert!(check_key("ssh-ed25519").is_err());
        assert!(
            check_key("ssh-dss AAAAB3NzaC1kc3MAAACBAP")
                .unwrap_err()
                .contains("not one sshd accepts")
        );
        assert!(check_key("ssh-ed25519 !!!").unwrap_err().contains("base64"));
        // A valid RSA blob labelled ed25519.
        let rsa = keygen(d.path(), "rsa");
        let b64 = rsa.split_whitespace().nth(1).unwrap();
        assert!(
            check_key(&format!("ssh-ed25519 {b64}"))
                .unwrap_err()
                .contains("not a ssh-ed25519 key")
        );
        assert!(check_key(&format!("{ED25519}\nssh-rsa AAAA")).is_err());
        check_user("alice").unwrap();
        check_user("_svc-1").unwrap();
        for bad in ["Alice", "1bob", "", "a b", "../etc", &"x".repeat(33)] {
            assert!(check_user(bad).is_err(), "{bad}");
        }
    }

    /// What nft 1.0.6 prints (captured from `nft -j list tables` and
    /// `nft -j list table inet bcd` in a network namespace).
    const LISTED_TABLES: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "inet", "name": "bcd", "handle": 1}}, {"table": {"family": "ip", "name": "theirs", "handle": 2}}]}"#;
    const LISTED_TABLE: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "inet", "name": "bcd", "handle": 1}}, {"chain": {"family": "inet", "table": "bcd", "name": "input", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}}, {"rule": {"family": "inet", "table": "bcd", "chain": "input", "handle": 2, "comment": "bcd:0123456789abcdef", "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 22}}, {"accept": null}]}}]}"#;

    #[test]
    fn nft_listings_are_read_for_drift_detection() {
        assert_eq!(has_our_table(LISTED_TABLES.as_bytes()), Ok(true));
        let theirs_only = LISTED_TABLES.replace("\"bcd\"", "\"other\"");
        assert_eq!(has_our_table(theirs_only.as_bytes()), Ok(false));
        assert_eq!(
            rule_comments(LISTED_TABLE.as_bytes()),
            Ok(vec!["bcd:0123456789abcdef".to_string()])
        );
        // The chain hooked elsewhere (or gone) is drift too.
        let moved = LISTED_TABLE.replace("\"hook\": \"input\"", "\"hook\": \"output\"");
        assert_eq!(
            rule_comments(moved.as_bytes()),
            Ok(vec![
                "bcd:0123456789abcdef".to_string(),
                "<chain missing>".to_string()
            ])
        );
        assert!(
            has_our_table(b"not json")
                .unwrap_err()
                .contains("nft list tables output")
        );
    }

    fn paths(etc: &Path) -> SshdDirs {
        SshdDirs {
            etc_dir: etc.to_path_buf(),
            sshd: PathBuf::from("/usr/sbin/sshd"),
        }
    }

    #[test]
    fn sshd_files_are_written_checked_by_sshd_and_removed() {
        assert!(
            Path::new("/usr/sbin/sshd").exists(),
            "sshd is missing: apt-get install openssh-server (scripts/test installs it)"
        );
        let d = tempfile::tempdir().unwrap();
        let p = paths(d.path());
        let spec = AccessSpec {
            users: vec![AccessUser {
                name: "alice".into(),
                authorized_keys: vec![ED25519.into()],
                principals: vec!["alice".into(), "gpu-admins".into()],
            }],
            trusted_user_ca_keys: vec![keygen(d.path(), "ed25519")],
            firewall: None,
        };
        assert_eq!(sshd(&p, &spec), Ok(true));
        let dir = d.path().join("ssh/bcd");
        assert_eq!(
            std::fs::read_to_string(dir.join("authorized_keys/alice")).unwrap(),
            format!("{ED25519}\n")
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("principals/alice")).unwrap(),
            "alice\ngpu-admins\n"
        );
        let conf = std::fs::read_to_string(d.path().join("ssh/sshd_config.d/bcd.conf")).unwrap();
        assert!(
            conf.contains("TrustedUserCAKeys") && conf.contains("%u"),
            "{conf}"
        );
        // sshd itself accepts a configuration that includes ours.
        let host = d.path().join("host");
        let out = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&host)
            .output()
            .unwrap();
        assert!(out.status.success());
        let cfg = d.path().join("sshd_config");
        std::fs::write(
            &cfg,
            format!(
                "HostKey {}\nInclude {}/ssh/sshd_config.d/*.conf\n",
                host.display(),
                d.path().display()
            ),
        )
        .unwrap();
        let out = std::process::Command::new("/usr/sbin/sshd")
            .arg("-t")
            .arg("-f")
            .arg(&cfg)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "sshd -t: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Again: nothing to do.
        assert_eq!(sshd(&p, &spec), Ok(false));
        // A bad key is refused before anything changes.
        let mut bad = spec.clone();
        bad.users[0].authorized_keys.push("ssh-ed25519 AAAA".into());
        assert!(matches!(sshd(&p, &bad), Err((Status::Failed, _))));
        assert!(
            std::fs::read_to_string(dir.join("authorized_keys/alice"))
                .unwrap()
                .lines()
                .count()
                == 1
        );
        // Dropping every user removes our files.
        assert_eq!(sshd(&p, &AccessSpec::default()), Ok(true));
        assert!(!d.path().join("ssh/sshd_config.d/bcd.conf").exists());
        assert!(!dir.join("authorized_keys/alice").exists());
    }
}
