//! The shared objects a dynamic ELF program needs, found as the glibc
//! dynamic loader would find them, like dracut's `inst_binary`.
//!
//! For a program this finds its interpreter (`PT_INTERP`) and, breadth
//! first, every `DT_NEEDED` library of the program and of the libraries
//! found. A name is looked up in this order:
//!
//! 1. `DT_RPATH` of the object and then of the objects that loaded it, up
//!    to the program, when the object has no `DT_RUNPATH` (loaders with a
//!    `DT_RUNPATH` contribute nothing);
//! 2. `DT_RUNPATH` of the object;
//! 3. the directories of `/etc/ld.so.conf` and the files it includes (the
//!    loader reads them through `/etc/ld.so.cache`);
//! 4. the default directories: `/lib/<multiarch>`, `/usr/lib/<multiarch>`,
//!    `/lib64` and `/usr/lib64` for 64-bit objects, `/lib`, `/usr/lib`.
//!
//! `$ORIGIN` and `${ORIGIN}` in a path list expand to the directory of the
//! object that carries the list (the program's real location, after its
//! symlinks). Entries with other tokens (`$LIB`, `$PLATFORM`) or relative
//! entries are skipped. Files of another ELF class, byte order or machine
//! are passed over, as the loader does. A name found once is not looked up
//! again, as the loader reuses an object already loaded under that name.
//!
//! The ramdisk has no `/etc/ld.so.cache`: a library found only through
//! `/etc/ld.so.conf` is copied but the loader in the ramdisk looks for it
//! only in the default directories, unless the image also carries a cache
//! or sets `LD_LIBRARY_PATH`.

use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use goblin::elf::Elf;
use goblin::elf::header::{self, EI_CLASS, EI_DATA, ELFCLASS64, ELFDATA2LSB};

use crate::archive::Archive;
use crate::host::{self, HostError, HostFile, clean, has_parent_dir, host_path, resolve};

/// Deepest nesting of `include` in `/etc/ld.so.conf` that is followed.
const MAX_CONF_DEPTH: usize = 16;

/// Why a program's closure could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(
        "{path} under {root} is not an ELF file; for a script, add its interpreter as a program"
    )]
    NotElf {
        root: PathBuf,
        path: PathBuf,
        #[source]
        source: goblin::error::Error,
    },
    #[error(
        "interpreter {interpreter} of {program} is missing under {root}: install the C library \
         the program was built for (libc6 on Debian)"
    )]
    MissingInterpreter {
        root: PathBuf,
        program: PathBuf,
        interpreter: PathBuf,
    },
    #[error(
        "library {name} needed by {needed_by} was not found under {root} in {searched}: \
         install the package that ships it, or list its directory in /etc/ld.so.conf.d"
    )]
    MissingLibrary {
        root: PathBuf,
        name: String,
        needed_by: PathBuf,
        searched: String,
    },
}

/// What a program needs from the tree to run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Closure {
    /// The interpreter named in the program, if it has one.
    pub interpreter: Option<PathBuf>,
    /// Every library needed, directly or not: the `DT_NEEDED` name and the
    /// path inside the root where it was found.
    pub libraries: BTreeMap<String, PathBuf>,
    /// The interpreter and the libraries with every symlink on the way to
    /// them, sorted by path: what goes into the archive.
    pub files: Vec<HostFile>,
}

impl Closure {
    /// True for a static program: nothing to copy besides the program.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

/// Computes the closure of `program`, an absolute path inside `root` (use
/// `/` for this machine).
pub fn closure(root: &Path, program: &Path) -> Result<Closure, ElfError> {
    let program = clean(program);
    let real = resolve(root, &program).map_err(|err| HostError::io(root, &program, err))?;
    let bytes = read(root, &program, &real)?;
    let origin = real.parent().unwrap_or(Path::new("/")).to_owned();
    let (target, interpreter, main) = parse(root, &program, &bytes, &origin)?;

    let mut files = BTreeMap::new();
    let interpreter = interpreter.map(PathBuf::from);
    if let Some(interpreter) = &interpreter {
        host::collect(root, interpreter, &mut files).map_err(|err| {
            if err.is_not_found() {
                ElfError::MissingInterpreter {
                    root: root.to_owned(),
                    program: program.clone(),
                    interpreter: interpreter.clone(),
                }
            } else {
                ElfError::Host(err)
            }
        })?;
    }

    let search = Search {
        root,
        target,
        conf_dirs: ld_so_conf_dirs(root)?,
    };
    let mut libraries = BTreeMap::new();
    let mut queue = VecDeque::from([main]);
    while let Some(object) = queue.pop_front() {
        for name in &object.needed {
            if libraries.contains_key(name) {
                continue;
            }
            let (path, bytes) = search.find(name, &object)?;
            host::collect(root, &path, &mut files)?;
            let origin = path.parent().unwrap_or(Path::new("/")).to_owned();
            let (_, _, mut library) = parse(root, &path, &bytes, &origin)?;
            library.loader_rpath = object.rpath_for_children();
            libraries.insert(name.clone(), path);
            queue.push_back(library);
        }
    }

    Ok(Closure {
        interpreter,
        libraries,
        files: files.into_values().collect(),
    })
}

/// Adds `program` (with the symlinks on its way) and its closure to
/// `archive` at the same paths as under `root`.
pub fn add_program(
    archive: &mut Archive,
    root: &Path,
    program: &Path,
) -> Result<Closure, ElfError> {
    let closure = closure(root, program)?;
    let mut files = BTreeMap::new();
    host::collect(root, program, &mut files)?;
    host::add_host_files(archive, files.values().chain(&closure.files))?;
    Ok(closure)
}

/// The kind of object a program can load: class, byte order, machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Target {
    is_64: bool,
    little_endian: bool,
    machine: u16,
}

impl Target {
    fn of(header: &header::Header) -> Self {
        Target {
            is_64: header.e_ident[EI_CLASS] == ELFCLASS64,
            little_endian: header.e_ident[EI_DATA] == ELFDATA2LSB,
            machine: header.e_machine,
        }
    }

    /// Debian's multiarch tuple for this kind of object.
    fn multiarch(self) -> Option<&'static str> {
        Some(match (self.machine, self.is_64, self.little_endian) {
            (header::EM_X86_64, true, _) => "x86_64-linux-gnu",
            (header::EM_X86_64, false, _) => "x86_64-linux-gnux32",
            (header::EM_386, false, _) => "i386-linux-gnu",
            (header::EM_AARCH64, true, true) => "aarch64-linux-gnu",
            (header::EM_ARM, false, true) => "arm-linux-gnueabihf",
            (header::EM_RISCV, true, _) => "riscv64-linux-gnu",
            (header::EM_PPC64, true, true) => "powerpc64le-linux-gnu",
            (header::EM_S390, true, _) => "s390x-linux-gnu",
            _ => return None,
        })
    }

    fn default_dirs(self) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        if let Some(tuple) = self.multiarch() {
            dirs.push(Path::new("/lib").join(tuple));
            dirs.push(Path::new("/usr/lib").join(tuple));
        }
        if self.is_64 {
            dirs.push("/lib64".into());
            dirs.push("/usr/lib64".into());
        }
        dirs.push("/lib".into());
        dirs.push("/usr/lib".into());
        dirs
    }
}

/// A parsed object, with its search paths already expanded.
#[derive(Debug)]
struct Object {
    path: PathBuf,
    needed: Vec<String>,
    rpath: Vec<PathBuf>,
    runpath: Vec<PathBuf>,
    /// `DT_RPATH` entries of the objects that loaded this one.
    loader_rpath: Vec<PathBuf>,
}

impl Object {
    /// The `DT_RPATH` directories this object searches for its own needs.
    fn rpath_chain(&self) -> impl Iterator<Item = &PathBuf> {
        let active = self.runpath.is_empty();
        self.rpath
            .iter()
            .chain(&self.loader_rpath)
            .filter(move |_| active)
    }

    /// What the objects this one loads inherit as their loaders'
    /// `DT_RPATH`: its own unless it has a `DT_RUNPATH`, then its loaders'.
    fn rpath_for_children(&self) -> Vec<PathBuf> {
        let own: &[PathBuf] = if self.runpath.is_empty() {
            &self.rpath
        } else {
            &[]
        };
        own.iter().chain(&self.loader_rpath).cloned().collect()
    }
}

fn read(root: &Path, path: &Path, real: &Path) -> Result<Vec<u8>, HostError> {
    fs::read(host_path(root, real)).map_err(|err| HostError::io(root, path, err))
}

/// Parses an object: its target, interpreter and expanded search paths.
fn parse(
    root: &Path,
    path: &Path,
    bytes: &[u8],
    origin: &Path,
) -> Result<(Target, Option<String>, Object), ElfError> {
    let elf = Elf::parse(bytes).map_err(|source| ElfError::NotElf {
        root: root.to_owned(),
        path: path.to_owned(),
        source,
    })?;
    let expand_all = |lists: &[&str]| -> Vec<PathBuf> {
        lists
            .iter()
            .flat_map(|list| list.split(':'))
            .filter_map(|entry| expand(entry, origin))
            .collect()
    };
    let object = Object {
        path: path.to_owned(),
        needed: elf.libraries.iter().map(|&name| name.to_owned()).collect(),
        rpath: expand_all(&elf.rpaths),
        runpath: expand_all(&elf.runpaths),
        loader_rpath: Vec::new(),
    };
    Ok((
        Target::of(&elf.header),
        elf.interpreter.map(str::to_owned),
        object,
    ))
}

/// Expands `$ORIGIN` in one search path entry; `None` for entries the
/// loader could not use here.
fn expand(entry: &str, origin: &Path) -> Option<PathBuf> {
    let origin = origin.to_str()?;
    let expanded = entry
        .replace("${ORIGIN}", origin)
        .replace("$ORIGIN", origin);
    (expanded.starts_with('/') && !expanded.contains('$')).then(|| PathBuf::from(expanded))
}

struct Search<'a> {
    root: &'a Path,
    target: Target,
    conf_dirs: Vec<PathBuf>,
}

impl Search<'_> {
    /// Finds `name` for `object`: the path inside the root and the bytes.
    fn find(&self, name: &str, object: &Object) -> Result<(PathBuf, Vec<u8>), ElfError> {
        if name.contains('/') {
            let path = clean(Path::new(name));
            return match self.candidate(&path)? {
                Some(bytes) => Ok((path, bytes)),
                None => Err(self.missing(name, object, &[path])),
            };
        }
        let defaults = self.target.default_dirs();
        let dirs: Vec<&PathBuf> = object
            .rpath_chain()
            .chain(&object.runpath)
            .chain(&self.conf_dirs)
            .chain(&defaults)
            .collect();
        for dir in &dirs {
            let dir = if has_parent_dir(dir) {
                match resolve(self.root, dir) {
                    Ok(dir) => dir,
                    Err(_) => continue,
                }
            } else {
                clean(dir)
            };
            let path = dir.join(name);
            if let Some(bytes) = self.candidate(&path)? {
                return Ok((path, bytes));
            }
        }
        Err(self.missing(name, object, &dirs))
    }

    /// The bytes of `path` when it is an ELF object the program can load.
    fn candidate(&self, path: &Path) -> Result<Option<Vec<u8>>, HostError> {
        let Ok(real) = resolve(self.root, path) else {
            return Ok(None);
        };
        let host = host_path(self.root, &real);
        if !fs::metadata(&host).is_ok_and(|meta| meta.is_file()) {
            return Ok(None);
        }
        let bytes = read(self.root, path, &real)?;
        let compatible = Elf::parse_header(&bytes).is_ok_and(|h| Target::of(&h) == self.target);
        Ok(compatible.then_some(bytes))
    }

    fn missing(&self, name: &str, object: &Object, dirs: &[impl AsRef<Path>]) -> ElfError {
        let searched = dirs
            .iter()
            .map(|dir| dir.as_ref().display().to_string())
            .collect::<Vec<_>>()
            .join(":");
        ElfError::MissingLibrary {
            root: self.root.to_owned(),
            name: name.to_owned(),
            needed_by: object.path.clone(),
            searched,
        }
    }
}

/// The directories of `/etc/ld.so.conf` under `root`, includes followed,
/// in order, each once. A missing file counts as empty.
fn ld_so_conf_dirs(root: &Path) -> Result<Vec<PathBuf>, HostError> {
    let mut dirs = Vec::new();
    read_conf(root, Path::new("/etc/ld.so.conf"), 0, &mut dirs)?;
    Ok(dirs)
}

fn read_conf(
    root: &Path,
    file: &Path,
    depth: usize,
    dirs: &mut Vec<PathBuf>,
) -> Result<(), HostError> {
    if depth > MAX_CONF_DEPTH {
        return Ok(());
    }
    let text = match resolve(root, file).and_then(|real| fs::read(host_path(root, &real))) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(HostError::io(root, file, err)),
    };
    let here = file.parent().unwrap_or(Path::new("/"));
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default().trim();
        let mut words = line.split_whitespace();
        match words.next() {
            None => {}
            Some("include") => {
                for pattern in words {
                    for conf in glob(root, &here.join(pattern))? {
                        read_conf(root, &conf, depth + 1, dirs)?;
                    }
                }
            }
            Some("hwcap") => {}
            Some(_) => {
                // Old syntax allowed "dir=TYPE".
                let dir = line.split('=').next().unwrap_or_default().trim_end();
                let dir = PathBuf::from(dir);
                if dir.is_absolute() && !dirs.contains(&dir) {
                    dirs.push(dir);
                }
            }
        }
    }
    Ok(())
}

/// Expands `*` and `?` in the last component of `pattern`, sorted; names
/// starting with `.` match only a pattern that does.
fn glob(root: &Path, pattern: &Path) -> Result<Vec<PathBuf>, HostError> {
    let (Some(dir), Some(name)) = (pattern.parent(), pattern.file_name()) else {
        return Ok(Vec::new());
    };
    let name = name.as_encoded_bytes();
    if !name.iter().any(|b| matches!(b, b'*' | b'?')) {
        return Ok(vec![pattern.to_owned()]);
    }
    let listing = resolve(root, dir).and_then(|real| fs::read_dir(host_path(root, &real)));
    let entries = match listing {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(HostError::io(root, dir, err)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|err| HostError::io(root, dir, err))?;
        let file_name = entry.file_name();
        let candidate = file_name.as_encoded_bytes();
        let hidden = candidate.starts_with(b".") && !name.starts_with(b".");
        if !hidden && wildcard(name, candidate) {
            found.push(dir.join(&file_name));
        }
    }
    found.sort();
    Ok(found)
}

/// Shell-style match of `*` and `?` against a whole name.
fn wildcard(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&c) if c == b'?' || c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    p = sp + 1;
                    n = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn wildcards_match_like_the_shell() {
        assert!(wildcard(b"*.conf", b"libc.conf"));
        assert!(wildcard(b"*.conf", b".conf"));
        assert!(!wildcard(b"*.conf", b"libc.conf.bak"));
        assert!(wildcard(b"a?c*", b"abcdef"));
        assert!(wildcard(b"*a*b", b"xxaxxb"));
        assert!(!wildcard(b"*a*b", b"xxaxxbx"));
        assert!(wildcard(b"*", b""));
        assert!(!wildcard(b"?", b""));
    }

    #[test]
    fn origin_is_expanded_and_unusable_entries_dropped() {
        let origin = Path::new("/opt/app/bin");
        assert_eq!(
            expand("$ORIGIN/../lib", origin),
            Some("/opt/app/bin/../lib".into())
        );
        assert_eq!(
            expand("${ORIGIN}/lib", origin),
            Some("/opt/app/bin/lib".into())
        );
        assert_eq!(expand("/usr/$LIB", origin), None);
        assert_eq!(expand("relative/lib", origin), None);
        assert_eq!(expand("", origin), None);
    }

    #[test]
    fn ld_so_conf_includes_are_followed_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("etc/ld.so.conf.d")).unwrap();
        fs::write(
            root.join("etc/ld.so.conf"),
            "# comment\n/opt/first\ninclude /etc/ld.so.conf.d/*.conf\n/opt/last=libc6 # old\n",
        )
        .unwrap();
        fs::write(root.join("etc/ld.so.conf.d/b.conf"), "/opt/b\n/opt/first\n").unwrap();
        fs::write(
            root.join("etc/ld.so.conf.d/a.conf"),
            "hwcap 0 nosegneg\n/opt/a\ninclude nested.inc\n",
        )
        .unwrap();
        fs::write(root.join("etc/ld.so.conf.d/nested.inc"), "/opt/nested\n").unwrap();
        fs::write(root.join("etc/ld.so.conf.d/.hidden.conf"), "/opt/hidden\n").unwrap();
        // An absolute link inside the root must not reach the host's /etc.
        symlink(
            "/etc/ld.so.conf.d/b.conf",
            root.join("etc/ld.so.conf.d/c.conf"),
        )
        .unwrap();
        let dirs = ld_so_conf_dirs(root).unwrap();
        assert_eq!(
            dirs,
            ["/opt/first", "/opt/a", "/opt/nested", "/opt/b", "/opt/last"].map(PathBuf::from)
        );
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            ld_so_conf_dirs(empty.path()).unwrap(),
            Vec::<PathBuf>::new()
        );
    }

    #[test]
    fn default_dirs_follow_the_target() {
        let x86_64 = Target {
            is_64: true,
            little_endian: true,
            machine: header::EM_X86_64,
        };
        assert_eq!(
            x86_64.default_dirs(),
            [
                "/lib/x86_64-linux-gnu",
                "/usr/lib/x86_64-linux-gnu",
                "/lib64",
                "/usr/lib64",
                "/lib",
                "/usr/lib"
            ]
            .map(PathBuf::from)
        );
        let i386 = Target {
            is_64: false,
            little_endian: true,
            machine: header::EM_386,
        };
        assert_eq!(i386.default_dirs()[0], Path::new("/lib/i386-linux-gnu"));
        assert!(!i386.default_dirs().contains(&PathBuf::from("/lib64")));
    }

    #[test]
    fn rpath_is_ignored_by_objects_with_a_runpath() {
        let object = |rpath: &[&str], runpath: &[&str], loader: &[&str]| Object {
            path: "/x".into(),
            needed: Vec::new(),
            rpath: rpath.iter().map(PathBuf::from).collect(),
            runpath: runpath.iter().map(PathBuf::from).collect(),
            loader_rpath: loader.iter().map(PathBuf::from).collect(),
        };
        let plain = object(&["/r"], &[], &["/loader"]);
        assert_eq!(
            plain.rpath_for_children(),
            ["/r", "/loader"].map(PathBuf::from)
        );
        let with_runpath = object(&["/r"], &["/run"], &["/loader"]);
        assert_eq!(with_runpath.rpath_chain().count(), 0);
        assert_eq!(
            with_runpath.rpath_for_children(),
            [PathBuf::from("/loader")]
        );
    }
}
