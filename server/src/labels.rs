//! Node labels and label selectors.
//!
//! A label is `key=value`, set by an operator (`nodes label`) and signed
//! inside the node's spec ([`bc_store::specs::Intent`]); a selector picks
//! nodes by them (`nodes list -l`, `rollouts start -l`, `commands run -l`).
//! Selectors are the equality-based ones operators know from Kubernetes:
//! comma-separated terms, all of which must hold: `key=value` (or `==`),
//! `key!=value` (also true when the key is not set), `key` (set, any
//! value) and `!key` (not set).

use std::collections::BTreeMap;
use std::fmt;

/// Labels one node may carry.
pub const MAX_LABELS: usize = 64;
/// Characters in a key, or in a value.
pub const MAX_LEN: usize = 63;
/// Terms in one selector.
pub const MAX_TERMS: usize = 32;

/// A key: 1 to 63 of `A-Z a-z 0-9 . _ - /`, starting and ending with a
/// letter or digit (`pool`, `gpu.model`, `example.com/rack`).
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("a label key is empty: write key=value".into());
    }
    check_chars("key", key, |c| {
        c.is_ascii_alphanumeric() || "._-/".contains(c)
    })
}

/// A value: up to 63 of `A-Z a-z 0-9 . _ -`, starting and ending with a
/// letter or digit when not empty.
pub fn check_value(key: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    check_chars(&format!("value of {key}"), value, |c| {
        c.is_ascii_alphanumeric() || "._-".contains(c)
    })
}

fn check_chars(what: &str, s: &str, allowed: impl Fn(char) -> bool) -> Result<(), String> {
    if s.len() > MAX_LEN {
        return Err(format!(
            "label {what} {:?}... is {} characters long, more than {MAX_LEN}",
            s.chars().take(16).collect::<String>(),
            s.len()
        ));
    }
    if let Some(bad) = s.chars().find(|c| !allowed(*c)) {
        return Err(format!(
            "label {what} {s:?} has {bad:?}: use letters, digits and . _ -{}",
            if what == "key" { " /" } else { "" }
        ));
    }
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !edge(s.chars().next()) || !edge(s.chars().last()) {
        return Err(format!(
            "label {what} {s:?} must start and end with a letter or digit"
        ));
    }
    Ok(())
}

/// Sets and removes labels, checking every key and value and the count.
pub fn apply(
    labels: &mut BTreeMap<String, String>,
    set: &BTreeMap<String, String>,
    remove: &[String],
) -> Result<(), String> {
    for (k, v) in set {
        check_key(k)?;
        check_value(k, v)?;
    }
    for k in remove {
        check_key(k)?;
        if set.contains_key(k) {
            return Err(format!("label {k} is both set and removed: say one"));
        }
    }
    for k in remove {
        labels.remove(k);
    }
    labels.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
    if labels.len() > MAX_LABELS {
        return Err(format!(
            "{} labels, more than the {MAX_LABELS} a node may carry: remove some (KEY-)",
            labels.len()
        ));
    }
    Ok(())
}

/// `nodes label` arguments: `key=value` sets, `key-` removes.
pub fn parse_changes(args: &[String]) -> Result<(BTreeMap<String, String>, Vec<String>), String> {
    let mut set = BTreeMap::new();
    let mut remove = Vec::new();
    for a in args {
        if let Some((k, v)) = a.split_once('=') {
            check_key(k)?;
            check_value(k, v)?;
            set.insert(k.to_string(), v.to_string());
        } else if let Some(k) = a.strip_suffix('-') {
            check_key(k)?;
            remove.push(k.to_string());
        } else {
            return Err(format!(
                "{a:?} is neither key=value (set) nor key- (remove): e.g. pool=a gpu- "
            ));
        }
    }
    if set.is_empty() && remove.is_empty() {
        return Err("no label given: e.g. pool=a to set, gpu- to remove".into());
    }
    Ok((set, remove))
}

/// One term of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Term {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
}

/// Terms that must all hold. Empty: every node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector(Vec<Term>);

impl Selector {
    /// Parses `pool=a,gpu!=h100,rack,!maintenance`; empty text selects
    /// everything.
    pub fn parse(text: &str) -> Result<Selector, String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(Selector::default());
        }
        let mut terms = Vec::new();
        for raw in text.split(',') {
            let t = raw.trim();
            let term = if let Some((k, v)) = t.split_once("!=") {
                Term::NotEquals(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                Term::Equals(k.trim().to_string(), v.trim().to_string())
            } else if let Some(k) = t.strip_prefix('!') {
                Term::Absent(k.trim().to_string())
            } else {
                Term::Exists(t.to_string())
            };
            let (key, value) = match &term {
                Term::Equals(k, v) | Term::NotEquals(k, v) => (k, Some(v)),
                Term::Exists(k) | Term::Absent(k) => (k, None),
            };
            check_key(key)
                .and_then(|()| value.map_or(Ok(()), |v| check_value(key, v)))
                .map_err(|e| format!("in selector term {t:?}: {e}"))?;
            terms.push(term);
        }
        if terms.len() > MAX_TERMS {
            return Err(format!(
                "{} selector terms, more than {MAX_TERMS}",
                terms.len()
            ));
        }
        Ok(Selector(terms))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|t| match t {
            Term::Equals(k, v) => labels.get(k) == Some(v),
            Term::NotEquals(k, v) => labels.get(k) != Some(v),
            Term::Exists(k) => labels.contains_key(k),
            Term::Absent(k) => !labels.contains_key(k),
        })
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match t {
                Term::Equals(k, v) => write!(f, "{k}={v}")?,
                Term::NotEquals(k, v) => write!(f, "{k}!={v}")?,
                Term::Exists(k) => write!(f, "{k}")?,
                Term::Absent(k) => write!(f, "!{k}")?,
            }
        }
        Ok(())
    }
}

/// Labels as `k=v,k=v`, the way selectors spell them.
pub fn show(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selectors_match_as_kubernetes_equality_selectors_do() {
        let node = labels(&[("pool", "a"), ("gpu", "h200"), ("rack", "r1")]);
        let hit = |s: &str| Selector::parse(s).unwrap().matches(&node);
        assert!(hit(""));
        assert!(hit("pool=a"));
        assert!(hit("pool==a, gpu=h200"));
        assert!(!hit("pool=a,gpu=h100"));
        assert!(hit("gpu!=h100"));
        assert!(hit("zone!=x"), "!= holds where the key is not set");
        assert!(!hit("gpu!=h200"));
        assert!(hit("rack"));
        assert!(!hit("zone"));
        assert!(hit("!zone"));
        assert!(!hit("!rack"));
        assert!(hit("empty!=x"));
        assert!(
            Selector::parse("e=")
                .unwrap()
                .matches(&labels(&[("e", "")]))
        );
    }

    #[test]
    fn bad_selectors_and_labels_say_what_to_write() {
        for (bad, says) in [
            ("pool=a,", "empty"),
            ("=a", "empty"),
            ("po ol=a", "' '"),
            ("pool=a b", "' '"),
            ("-pool=a", "start and end"),
            ("pool=a/b", "'/'"),
        ] {
            let e = Selector::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let long = "k".repeat(64);
        assert!(check_key(&long).unwrap_err().contains("more than 63"));
        let e = parse_changes(&["pool".into()]).unwrap_err();
        assert!(e.contains("key=value (set) nor key- (remove)"), "{e}");
        let (set, remove) = parse_changes(&["pool=a".into(), "gpu-".into()]).unwrap();
        assert_eq!(
            (set, remove),
            (labels(&[("pool", "a")]), vec!["gpu".into()])
        );
    }

    #[test]
    fn changes_apply_within_the_bound() {
        let mut l = labels(&[("gpu", "h100"), ("old", "1")]);
        apply(&mut l, &labels(&[("gpu", "h200")]), &["old".into()]).unwrap();
        assert_eq!(l, labels(&[("gpu", "h200")]));
        let e = apply(&mut l, &labels(&[("x", "1")]), &["x".into()]).unwrap_err();
        assert!(e.contains("both set and removed"), "{e}");
        let many: BTreeMap<String, String> = (0..MAX_LABELS)
            .map(|i| (format!("k{i}"), "v".into()))
            .collect();
        let e = apply(&mut l, &many, &[]).unwrap_err();
        assert!(e.contains("more than the 64"), "{e}");
    }

    proptest! {
        /// Any text is a selector or an error, never a panic; a parsed one
        /// prints to text that parses back to it.
        #[test]
        fn any_text_parses_or_is_refused(text in ".{0,80}") {
            if let Ok(s) = Selector::parse(&text) {
                prop_assert_eq!(Selector::parse(&s.to_string()).unwrap(), s);
            }
        }

        #[test]
        fn printed_selectors_read_back(
            terms in prop::collection::vec(
                ("[a-z][a-z0-9./-]{0,8}[a-z0-9]", "[a-z0-9]{0,6}", 0u8..4), 0..6)
        ) {
            let s = Selector(terms.into_iter().map(|(k, v, op)| match op {
                0 => Term::Equals(k, v),
                1 => Term::NotEquals(k, v),
                2 => Term::Exists(k),
                _ => Term::Absent(k),
            }).collect());
            prop_assert_eq!(Selector::parse(&s.to_string()).unwrap(), s);
        }
    }
}
