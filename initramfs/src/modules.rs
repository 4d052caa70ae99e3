//! Kernel modules and their dependencies, as `depmod` recorded them.
//!
//! A modules directory `/lib/modules/<kver>` holds `modules.dep`, one line
//! per module: its path relative to the directory, a colon, and the paths
//! of every module it depends on, directly or not, e.g.
//! `kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko
//! kernel/net/core/failover.ko`. Modules may be compressed (`.ko.xz`,
//! `.ko.zst`, `.ko.gz`); they are copied as they are.
//!
//! A module is named as `modprobe` takes it: the file name without `.ko`
//! and compression suffix, with `-` and `_` equivalent (`virtio-net` and
//! `virtio_net.ko` both name `virtio_net`). Names listed in
//! `modules.builtin` are built into the kernel and need no file.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::archive::Archive;
use crate::host::{self, HostError, host_path, resolve};

/// Suffixes a module file may have, longest first.
const SUFFIXES: [&str; 4] = [".ko.xz", ".ko.zst", ".ko.gz", ".ko"];

/// Why modules could not be resolved or copied.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("kernel version {0:?} is not a directory name under /lib/modules")]
    BadKernelVersion(String),
    #[error(
        "no modules.dep in {dir} under {root}: generate it with depmod -b {root} {kver} \
         (a kernel package unpacked with dpkg-deb ships none)"
    )]
    NoModulesDep {
        root: PathBuf,
        dir: PathBuf,
        kver: String,
    },
    #[error(
        "line {line} of modules.dep is not \"path: dependencies\": {text:?}; regenerate it with depmod"
    )]
    Parse { line: usize, text: String },
    #[error(
        "{} not found for kernel {kver}, neither in modules.dep nor in modules.builtin: \
         check the names (modinfo -k {kver} NAME) and that the image is built for this kernel",
        plural_names(.names)
    )]
    NotFound { kver: String, names: Vec<String> },
    #[error(
        "modules.dep lists {dependency} as a dependency of {module} but has no line for it: \
         regenerate it with depmod"
    )]
    MissingDependency { module: String, dependency: String },
    #[error("modules.dep has a dependency cycle through {0}: regenerate it with depmod")]
    Cycle(String),
}

fn plural_names(names: &[String]) -> String {
    match names {
        [one] => format!("module {one}"),
        many => format!("modules {}", many.join(", ")),
    }
}

/// One module to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    /// The name `modprobe` takes, with `_` for `-`.
    pub name: String,
    /// The path relative to the modules directory, as in `modules.dep`.
    pub path: String,
    /// Paths of the modules it depends on, as listed in `modules.dep`.
    pub deps: Vec<String>,
}

/// The modules to load for a request, dependencies first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadPlan {
    /// Every module, each once, each after all it depends on.
    pub modules: Vec<Module>,
    /// Requested names that are built into the kernel.
    pub builtin: Vec<String>,
}

impl LoadPlan {
    /// A `modules.dep` with a line for each module of the plan, in load
    /// order, for `modprobe` in the ramdisk.
    pub fn modules_dep(&self) -> String {
        self.modules
            .iter()
            .map(|module| {
                let mut line = format!("{}:", module.path);
                for dep in &module.deps {
                    line.push(' ');
                    line.push_str(dep);
                }
                line.push('\n');
                line
            })
            .collect()
    }

    /// The load list: one path relative to the modules directory a line,
    /// in load order, like `modules.order`.
    pub fn load_order(&self) -> String {
        self.modules
            .iter()
            .map(|module| format!("{}\n", module.path))
            .collect()
    }
}

/// A parsed modules directory.
#[derive(Debug, Clone)]
pub struct Modules {
    kver: String,
    /// Every module: its path and its dependencies' paths.
    deps: BTreeMap<String, Vec<String>>,
    /// Module name to path; the first line for a name wins, as in modprobe.
    by_name: HashMap<String, String>,
    builtin: BTreeSet<String>,
    builtin_text: Option<String>,
}

impl Modules {
    /// Reads `/lib/modules/<kver>/modules.dep` (and `modules.builtin` when
    /// present) under `root`.
    pub fn open(root: &Path, kver: &str) -> Result<Self, ModuleError> {
        let dir = modules_dir(kver)?;
        let read = |name: &str| -> Result<Option<String>, ModuleError> {
            let path = dir.join(name);
            match resolve(root, &path).and_then(|real| fs::read(host_path(root, &real))) {
                Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
                Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(err) => Err(HostError::io(root, &path, err).into()),
            }
        };
        let dep = read("modules.dep")?.ok_or_else(|| ModuleError::NoModulesDep {
            root: root.to_owned(),
            dir: dir.clone(),
            kver: kver.to_owned(),
        })?;
        let builtin = read("modules.builtin")?;
        Self::parse(kver, &dep, builtin.as_deref())
    }

    /// Parses the text of `modules.dep` and, if there is one, of
    /// `modules.builtin` for kernel `kver`.
    pub fn parse(
        kver: &str,
        modules_dep: &str,
        modules_builtin: Option<&str>,
    ) -> Result<Self, ModuleError> {
        let dir = modules_dir(kver)?;
        let relative = |path: &str| -> Option<String> {
            let path = Path::new(path);
            let path = path.strip_prefix(&dir).unwrap_or(path);
            let text = path.to_str()?;
            let valid = !text.is_empty()
                && !path.is_absolute()
                && !path
                    .components()
                    .any(|c| c == std::path::Component::ParentDir);
            valid.then(|| text.to_owned())
        };
        let mut deps = BTreeMap::new();
        let mut by_name = HashMap::new();
        for (index, text) in modules_dep.lines().enumerate() {
            if text.trim().is_empty() {
                continue;
            }
            let parse_error = || ModuleError::Parse {
                line: index + 1,
                text: text.to_owned(),
            };
            let (path, list) = text.split_once(':').ok_or_else(parse_error)?;
            let path = relative(path.trim()).ok_or_else(parse_error)?;
            let list = list
                .split_whitespace()
                .map(|dep| relative(dep).ok_or_else(parse_error))
                .collect::<Result<Vec<_>, _>>()?;
            by_name
                .entry(module_name(&path))
                .or_insert_with(|| path.clone());
            deps.entry(path).or_insert(list);
        }
        let builtin = modules_builtin
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .map(module_name)
            .collect();
        Ok(Modules {
            kver: kver.to_owned(),
            deps,
            by_name,
            builtin,
            builtin_text: modules_builtin.map(str::to_owned),
        })
    }

    /// The kernel version these modules are for.
    pub fn kver(&self) -> &str {
        &self.kver
    }

    /// The modules directory inside the root: `/lib/modules/<kver>`.
    pub fn dir(&self) -> PathBuf {
        Path::new("/lib/modules").join(&self.kver)
    }

    /// True when `name` is built into the kernel.
    pub fn is_builtin(&self, name: &str) -> bool {
        self.builtin.contains(&normalize_name(name))
    }

    /// The path of module `name`, if there is one.
    pub fn path_of(&self, name: &str) -> Option<&str> {
        self.by_name.get(&normalize_name(name)).map(String::as_str)
    }

    /// The modules to load for `names`, with every dependency, each once,
    /// dependencies first. Dependencies of one module are loaded in the
    /// reverse of their order in `modules.dep`, as `modprobe` does.
    pub fn resolve<S: AsRef<str>>(&self, names: &[S]) -> Result<LoadPlan, ModuleError> {
        let mut plan = LoadPlan::default();
        let mut missing = Vec::new();
        let mut roots = Vec::new();
        for name in names {
            let name = normalize_name(name.as_ref());
            match self.by_name.get(&name) {
                Some(path) => roots.push(path.clone()),
                None if self.builtin.contains(&name) => {
                    if !plan.builtin.contains(&name) {
                        plan.builtin.push(name);
                    }
                }
                None => missing.push(name),
            }
        }
        if !missing.is_empty() {
            return Err(ModuleError::NotFound {
                kver: self.kver.clone(),
                names: missing,
            });
        }
        let mut state = HashMap::new();
        for path in roots {
            self.visit(&path, &mut state, &mut plan.modules)?;
        }
        Ok(plan)
    }

    fn visit(
        &self,
        path: &str,
        state: &mut HashMap<String, bool>,
        out: &mut Vec<Module>,
    ) -> Result<(), ModuleError> {
        match state.get(path) {
            Some(true) => return Ok(()),
            Some(false) => return Err(ModuleError::Cycle(path.to_owned())),
            None => {}
        }
        state.insert(path.to_owned(), false);
        // Callers only pass paths that have a line.
        let deps = self.deps.get(path).cloned().unwrap_or_default();
        for dep in deps.iter().rev() {
            if !self.deps.contains_key(dep) {
                return Err(ModuleError::MissingDependency {
                    module: path.to_owned(),
                    dependency: dep.clone(),
                });
            }
            self.visit(dep, state, out)?;
        }
        state.insert(path.to_owned(), true);
        out.push(Module {
            name: module_name(path),
            path: path.to_owned(),
            deps,
        });
        Ok(())
    }

    /// Copies the plan's modules from under `root` into `archive` at
    /// `/lib/modules/<kver>/<path>`, with the plan's `modules.dep`, its
    /// load list as `modules.order`, and `modules.builtin` when there is one.
    pub fn add_to(
        &self,
        archive: &mut Archive,
        root: &Path,
        plan: &LoadPlan,
    ) -> Result<(), ModuleError> {
        self.add_carried(archive, root, plan, plan)
    }

    /// As [`Modules::add_to`], for an image that carries more modules than
    /// it loads at boot: `carried`'s modules and `modules.dep`, and
    /// `at_boot`'s load list as `modules.order`. The rest wait for a
    /// device that asks for them (by modalias). `at_boot` must be part of
    /// `carried`.
    pub fn add_carried(
        &self,
        archive: &mut Archive,
        root: &Path,
        carried: &LoadPlan,
        at_boot: &LoadPlan,
    ) -> Result<(), ModuleError> {
        let dir = self.dir();
        let mut files = BTreeMap::new();
        for module in &carried.modules {
            host::collect(root, &dir.join(&module.path), &mut files)?;
        }
        host::add_host_files(archive, files.values())?;
        let mut generated = vec![
            ("modules.dep", carried.modules_dep()),
            ("modules.order", at_boot.load_order()),
        ];
        if let Some(text) = &self.builtin_text {
            generated.push(("modules.builtin", text.clone()));
        }
        for (name, text) in generated {
            let path = dir.join(name);
            archive
                .file(&path, 0o644, text)
                .map_err(|source| HostError::Archive { path, source })?;
        }
        Ok(())
    }
}

/// Resolves `names` in `/lib/modules/<kver>` under `root` and adds the
/// modules with their dependencies to `archive` (see [`Modules::add_to`]).
pub fn add_modules<S: AsRef<str>>(
    archive: &mut Archive,
    root: &Path,
    kver: &str,
    names: &[S],
) -> Result<LoadPlan, ModuleError> {
    let modules = Modules::open(root, kver)?;
    let plan = modules.resolve(names)?;
    modules.add_to(archive, root, &plan)?;
    Ok(plan)
}

fn modules_dir(kver: &str) -> Result<PathBuf, ModuleError> {
    if kver.is_empty() || kver == "." || kver == ".." || kver.contains(['/', '\0']) {
        return Err(ModuleError::BadKernelVersion(kver.to_owned()));
    }
    Ok(Path::new("/lib/modules").join(kver))
}

/// The name of the module at `path`: `kernel/net/virtio-net.ko.xz` is
/// `virtio_net`.
pub fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    normalize_name(file)
}

/// A name as `modprobe` compares it: suffixes dropped, `-` as `_`.
fn normalize_name(name: &str) -> String {
    let name = name.trim();
    let stem = SUFFIXES
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name);
    stem.replace('-', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "\
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/net/core/failover.ko:
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/drivers/net/virtio_net.ko.xz: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko
kernel/drivers/misc/pvpanic/pvpanic-mmio.ko.zst: kernel/drivers/misc/pvpanic/pvpanic.ko
kernel/drivers/misc/pvpanic/pvpanic.ko:

/lib/modules/6.1.0-test/kernel/fs/old-style.ko: kernel/drivers/virtio/virtio.ko
";

    fn modules() -> Modules {
        Modules::parse(
            "6.1.0-test",
            DEP,
            Some("kernel/drivers/virtio/virtio_pci.ko\n"),
        )
        .unwrap()
    }

    fn names(plan: &LoadPlan) -> Vec<&str> {
        plan.modules.iter().map(|m| m.name.as_str()).collect()
    }

    #[test]
    fn names_match_like_modprobe() {
        assert_eq!(
            module_name("kernel/drivers/net/virtio_net.ko.xz"),
            "virtio_net"
        );
        assert_eq!(module_name("pvpanic-mmio.ko.zst"), "pvpanic_mmio");
        assert_eq!(module_name("a.ko.gz"), "a");
        let m = modules();
        assert_eq!(
            m.path_of("virtio-net"),
            Some("kernel/drivers/net/virtio_net.ko.xz")
        );
        assert_eq!(m.path_of("pvpanic_mmio.ko"), m.path_of("pvpanic-mmio"));
        assert_eq!(m.path_of("old_style"), Some("kernel/fs/old-style.ko"));
        assert!(m.is_builtin("virtio-pci"));
    }

    #[test]
    fn dependencies_come_first_and_once() {
        let plan = modules()
            .resolve(&["virtio_net", "net_failover", "pvpanic-mmio", "old_style"])
            .unwrap();
        assert_eq!(
            names(&plan),
            [
                "failover",
                "net_failover",
                "virtio_net",
                "pvpanic",
                "pvpanic_mmio",
                "virtio_ring",
                "virtio",
                "old_style"
            ]
        );
        assert_eq!(
            plan.load_order().lines().next(),
            Some("kernel/net/core/failover.ko")
        );
        assert!(plan.modules_dep().contains(
            "kernel/drivers/net/virtio_net.ko.xz: kernel/drivers/net/net_failover.ko \
             kernel/net/core/failover.ko\n"
        ));
        assert!(
            plan.modules_dep()
                .contains("kernel/net/core/failover.ko:\n")
        );
    }

    #[test]
    fn builtin_modules_need_no_file() {
        let plan = modules().resolve(&["virtio_pci", "virtio"]).unwrap();
        assert_eq!(plan.builtin, ["virtio_pci"]);
        assert_eq!(names(&plan), ["virtio_ring", "virtio"]);
    }

    #[test]
    fn every_missing_name_is_reported() {
        let err = modules()
            .resolve(&["virtio_net", "e1000", "nope"])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "modules e1000, nope not found for kernel 6.1.0-test, neither in modules.dep nor \
             in modules.builtin: check the names (modinfo -k 6.1.0-test NAME) and that the \
             image is built for this kernel"
        );
    }

    #[test]
    fn broken_modules_dep_is_reported() {
        let err = Modules::parse("k", "a.ko: b.ko\n", None)
            .unwrap()
            .resolve(&["a"])
            .unwrap_err();
        assert!(
            matches!(err, ModuleError::MissingDependency { .. }),
            "{err}"
        );

        let err = Modules::parse("k", "a.ko: b.ko\nb.ko: a.ko\n", None)
            .unwrap()
            .resolve(&["a"])
            .unwrap_err();
        assert!(matches!(err, ModuleError::Cycle(_)), "{err}");

        for bad in [
            "no colon here",
            "../escape.ko:",
            "/elsewhere/x.ko:",
            "a.ko: ../b.ko",
        ] {
            assert!(
                matches!(
                    Modules::parse("k", bad, None),
                    Err(ModuleError::Parse { line: 1, .. })
                ),
                "{bad}"
            );
        }
        for kver in ["", "..", "a/b"] {
            assert!(matches!(
                Modules::parse(kver, "", None),
                Err(ModuleError::BadKernelVersion(_))
            ));
        }
    }
}
