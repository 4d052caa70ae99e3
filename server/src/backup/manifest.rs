//! A backup set's manifest (`manifest.json`, written last): what the set
//! is and every file in it with its SHA-256 and size. Its format is
//! versioned ([`VERSION`]) and pinned by `server/tests/golden/
//! backup-manifest.json`; a reader refuses a format it does not know.

use serde::{Deserialize, Serialize};

use bc_store::backups::Dump;

/// The manifest's name in a set's directory.
pub const FILE: &str = "manifest.json";
/// What a manifest says it is.
pub const FORMAT: &str = "better-compute-backup";
/// The format version this binary writes and reads.
pub const VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// The set's id (its row in `backups`).
    pub id: String,
    /// When its row was created, on the store's clock (unix ms).
    pub created_at_ms: i64,
    /// When the dump's transaction read the store (unix ms).
    pub taken_at_ms: i64,
    pub store: StoreInfo,
    /// Every file of the set but this one, by path relative to the set.
    pub files: Vec<FileEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreInfo {
    /// `sqlite` or `postgres`.
    pub backend: String,
    pub schema_version: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub path: String,
    /// Lowercase hex.
    pub sha256: String,
    pub size: u64,
}

impl Manifest {
    pub fn new(id: &str, created_at_ms: i64, dump: &Dump, files: Vec<FileEntry>) -> Manifest {
        Manifest {
            format: FORMAT.into(),
            version: VERSION,
            id: id.into(),
            created_at_ms,
            taken_at_ms: dump.taken_at,
            store: StoreInfo {
                backend: dump.backend.clone(),
                schema_version: dump.schema_version,
            },
            files,
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("plain data serializes");
        v.push(b'\n');
        v
    }

    /// Reads a manifest; another format, or a version this binary does not
    /// know, is refused.
    pub fn parse(bytes: &[u8]) -> anyhow::Result<Manifest> {
        let v: serde_json::Value = serde_json::from_slice(bytes)?;
        anyhow::ensure!(v["format"] == FORMAT, "it is not a {FORMAT} manifest");
        let version = v["version"].as_u64().unwrap_or(0);
        anyhow::ensure!(
            version == u64::from(VERSION),
            "it is manifest format version {version}; this better-compute reads version \
             {VERSION}: restore with the release that wrote it"
        );
        Ok(serde_json::from_value(v)?)
    }

    pub fn total_size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOLDEN: &str = "tests/golden/backup-manifest.json";

    fn sample() -> Manifest {
        Manifest::new(
            "bk-20270115T080000-0a1b",
            1_800_000_000_000,
            &Dump {
                backend: "sqlite".into(),
                schema_version: 13,
                taken_at: 1_800_000_000_250,
                tables: vec![],
                sequences: vec![],
            },
            vec![
                FileEntry {
                    path: "store/nodes.jsonl".into(),
                    sha256: "ab".repeat(32),
                    size: 1234,
                },
                FileEntry {
                    path: "keys/ca.key".into(),
                    sha256: "cd".repeat(32),
                    size: 227,
                },
            ],
        )
    }

    /// The format is pinned: a change to it is a new VERSION, with the
    /// golden file regenerated (BC_UPDATE_GOLDEN=1) and committed.
    #[test]
    fn the_manifest_format_is_pinned_by_its_golden_file() {
        let got = String::from_utf8(sample().to_json()).unwrap();
        if std::env::var_os("BC_UPDATE_GOLDEN").is_some() {
            std::fs::write(GOLDEN, &got).unwrap();
        }
        let want = std::fs::read_to_string(GOLDEN).unwrap_or_default();
        assert!(
            got == want,
            "the backup manifest format changed: raise manifest::VERSION, regenerate {GOLDEN} \
             with BC_UPDATE_GOLDEN=1 and commit both\n--- got ---\n{got}"
        );
        assert_eq!(Manifest::parse(want.as_bytes()).unwrap(), sample());
        assert_eq!(sample().total_size(), 1461);
    }

    #[test]
    fn another_format_or_version_is_refused() {
        let mut m = serde_json::to_value(sample()).unwrap();
        m["version"] = 2.into();
        let e = Manifest::parse(&serde_json::to_vec(&m).unwrap()).unwrap_err();
        assert!(e.to_string().contains("version 2"), "{e}");
        m["format"] = "tarball".into();
        assert!(Manifest::parse(&serde_json::to_vec(&m).unwrap()).is_err());
    }
}
