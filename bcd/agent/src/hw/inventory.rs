//! The inventory the node reports: canonical JSON per section and its
//! hash (hashes travel in Hello, bodies when the server asks).

use bcd_core::report::InventorySection;
use serde::Serialize;

use super::Host;

/// One inventory section: canonical JSON and its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub name: InventorySection,
    pub body: Vec<u8>,
    pub sha256: String,
}

impl Section {
    fn new(name: InventorySection, value: &impl Serialize) -> Section {
        let body = serde_json::to_vec(value).expect("inventory serializes");
        Section {
            name,
            sha256: bcd_proto::fingerprint(&body),
            body,
        }
    }
}

/// The inventory the node reports: hashes in Hello, bodies on request.
pub fn inventory(host: &dyn Host) -> Vec<Section> {
    let gpus = match host.gpus().list() {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!(error = %e, "GPU inventory failed");
            Vec::new()
        }
    };
    #[derive(Serialize)]
    struct HostSection {
        hostname: String,
        agent_version: &'static str,
        /// So the boot endpoint finds the node by a network card added
        /// or replaced since it joined.
        macs: Vec<String>,
    }
    vec![
        Section::new(
            InventorySection::Host,
            &HostSection {
                hostname: host.hostname(),
                agent_version: env!("CARGO_PKG_VERSION"),
                macs: host.macs(),
            },
        ),
        Section::new(InventorySection::Gpus, &gpus),
        Section::new(InventorySection::Tpm, &host.tpm().info()),
    ]
}
