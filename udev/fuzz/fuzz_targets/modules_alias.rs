//! modules.alias comes from the image and modaliases from sysfs: parsing
//! and matching must never panic, and the prefix index must find exactly
//! what a scan of every alias finds. The input is the file's text, then a
//! NUL, then a modalias.
#![no_main]

use bcd_udev::{Aliases, fnmatch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (file, query) = text.split_once('\0').unwrap_or((&text, "pci:v0000"));
    let Ok(aliases) = Aliases::parse(file) else {
        return;
    };
    let found = aliases.modules_for(query);
    let normalized = query.replace('-', "_");
    if !query.contains('[') {
        let mut scanned: Vec<&str> = Vec::new();
        for alias in aliases.iter() {
            if fnmatch(&alias.pattern, &normalized) && !scanned.contains(&alias.module.as_str()) {
                scanned.push(&alias.module);
            }
        }
        assert_eq!(found, scanned);
    }
});
