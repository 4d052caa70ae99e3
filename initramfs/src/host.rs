//! Files taken from a filesystem tree (the host, or a sysroot in tests).
//!
//! Paths here are absolute paths *inside* a root: `/lib/x86_64-linux-gnu/libc.so.6`
//! under root `/srv/sysroot` is the host file
//! `/srv/sysroot/lib/x86_64-linux-gnu/libc.so.6`. Symlinks are followed
//! as if the root were `/`: an absolute target restarts at the root and
//! `..` never leaves it, so a sysroot's `/lib64/ld-linux-x86-64.so.2 ->
//! /lib/...` never reaches the host's own `/lib`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use crate::archive::{Archive, BuildError};
use crate::newc::PERM_MASK;

/// Most symlinks followed while resolving one path, as Linux allows.
const MAX_SYMLINKS: usize = 40;

/// A file to copy from the tree into an archive at the same path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum HostFile {
    /// A regular file at `path`, read from `source` on this machine.
    Regular {
        path: PathBuf,
        source: PathBuf,
        mode: u32,
    },
    /// A symlink at `path` whose target is `target`, as the archive stores it.
    Symlink { path: PathBuf, target: PathBuf },
}

impl HostFile {
    /// Where it goes: an absolute path inside the root and the archive.
    pub fn path(&self) -> &Path {
        match self {
            HostFile::Regular { path, .. } | HostFile::Symlink { path, .. } => path,
        }
    }
}

/// Why files could not be taken from the tree.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot read {path} under {root}")]
    Io {
        root: PathBuf,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path} under {root} is a {kind}; only regular files and symlinks to them can be copied"
    )]
    NotRegular {
        root: PathBuf,
        path: PathBuf,
        kind: &'static str,
    },
    #[error("cannot add {path} to the archive")]
    Archive {
        path: PathBuf,
        #[source]
        source: BuildError,
    },
}

impl HostError {
    pub(crate) fn io(root: &Path, path: &Path, source: io::Error) -> Self {
        HostError::Io {
            root: root.to_owned(),
            path: path.to_owned(),
            source,
        }
    }

    /// True when the error is a missing file or directory.
    pub fn is_not_found(&self) -> bool {
        matches!(self, HostError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// The host path of `path` inside `root`, symlinks not followed.
pub(crate) fn host_path(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// `path` made absolute with `.`, `..` and repeated slashes applied
/// lexically; `..` at the top stays at `/`.
pub(crate) fn clean(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// True when `path` has a `..` component.
pub(crate) fn has_parent_dir(path: &Path) -> bool {
    path.components().any(|c| c == Component::ParentDir)
}

/// Resolves every symlink in `path` as the kernel would with `root` as
/// `/`. The result is absolute inside the root and free of symlinks; the
/// whole path must exist.
pub(crate) fn resolve(root: &Path, path: &Path) -> io::Result<PathBuf> {
    let mut todo: Vec<OsString> = Vec::new();
    push_components(&mut todo, path);
    let mut done = PathBuf::from("/");
    let mut links = 0;
    while let Some(part) = todo.pop() {
        if part == ".." {
            done.pop();
            continue;
        }
        let next = done.join(&part);
        let host = host_path(root, &next);
        if fs::symlink_metadata(&host)?.file_type().is_symlink() {
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(io::Error::other("too many levels of symbolic links"));
            }
            let target = fs::read_link(&host)?;
            if target.is_absolute() {
                done = PathBuf::from("/");
            }
            push_components(&mut todo, &target);
        } else {
            done = next;
        }
    }
    Ok(done)
}

/// Pushes the normal and `..` components of `path` so that the first is
/// popped first.
fn push_components(stack: &mut Vec<OsString>, path: &Path) {
    let parts: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(part) => Some(part.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect();
    stack.extend(parts.into_iter().rev());
}

/// The files that make `path` work inside an archive: the path itself and,
/// while it is a symlink, the file it points to, until a regular file.
///
/// Directories on the way become real directories in the archive even when
/// they are symlinks in the tree (`/lib -> usr/lib` on a merged-/usr
/// system), so every path resolves in the archive as in the tree without
/// directory symlinks that later entries would have to go through. A
/// relative link target is kept when it leads to the same file from the
/// link's place in the archive; otherwise the archive gets the absolute
/// resolved target.
pub fn host_files(root: &Path, path: &Path) -> Result<Vec<HostFile>, HostError> {
    let mut found = BTreeMap::new();
    collect(root, path, &mut found)?;
    Ok(found.into_values().collect())
}

/// Adds to `found` what [`host_files`] returns for `path`, stopping at a
/// path already there.
pub(crate) fn collect(
    root: &Path,
    path: &Path,
    found: &mut BTreeMap<PathBuf, HostFile>,
) -> Result<(), HostError> {
    let mut current = clean(path);
    let mut links = 0;
    while !found.contains_key(&current) {
        let err = |source| HostError::io(root, &current, source);
        let parent = current.parent().unwrap_or(Path::new("/"));
        let physical_parent = resolve(root, parent).map_err(err)?;
        let name = current
            .file_name()
            .ok_or_else(|| err(io::Error::other("the root itself is no file")))?;
        let physical = physical_parent.join(name);
        let host = host_path(root, &physical);
        let meta = fs::symlink_metadata(&host).map_err(err)?;
        let kind = meta.file_type();
        if kind.is_symlink() {
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(err(io::Error::other("too many levels of symbolic links")));
            }
            let target = fs::read_link(&host).map_err(err)?;
            let wanted = resolve(root, &physical_parent.join(&target)).map_err(err)?;
            let lexical = clean(&parent.join(&target));
            let (stored, next) = if resolve(root, &lexical).ok().as_ref() == Some(&wanted) {
                (target, lexical)
            } else {
                (wanted.clone(), wanted)
            };
            found.insert(
                current.clone(),
                HostFile::Symlink {
                    path: current,
                    target: stored,
                },
            );
            current = next;
        } else if kind.is_file() {
            found.insert(
                current.clone(),
                HostFile::Regular {
                    path: current,
                    source: host,
                    mode: meta.permissions().mode() & PERM_MASK,
                },
            );
            return Ok(());
        } else {
            let kind = if kind.is_dir() {
                "directory"
            } else {
                "special file"
            };
            return Err(HostError::NotRegular {
                root: root.to_owned(),
                path: current,
                kind,
            });
        }
    }
    Ok(())
}

/// Reads `files` from the tree into `archive` at their paths.
pub fn add_host_files<'a>(
    archive: &mut Archive,
    files: impl IntoIterator<Item = &'a HostFile>,
) -> Result<(), HostError> {
    for file in files {
        let path = file.path();
        let added = match file {
            HostFile::Regular { source, mode, .. } => {
                let data = fs::read(source).map_err(|source_err| HostError::Io {
                    root: PathBuf::from("/"),
                    path: source.clone(),
                    source: source_err,
                })?;
                archive.file(path, *mode, data)
            }
            HostFile::Symlink { target, .. } => archive.symlink(path, target),
        };
        added.map_err(|source| HostError::Archive {
            path: path.to_owned(),
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// A merged-/usr tree whose links point outside it if followed on the host.
    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu")).unwrap();
        fs::create_dir_all(root.join("usr/lib64")).unwrap();
        symlink("usr/lib", root.join("lib")).unwrap();
        symlink("usr/lib64", root.join("lib64")).unwrap();
        fs::write(root.join("usr/lib/x86_64-linux-gnu/ld.so"), b"ld").unwrap();
        fs::set_permissions(
            root.join("usr/lib/x86_64-linux-gnu/ld.so"),
            fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        symlink(
            "/lib/x86_64-linux-gnu/ld.so",
            root.join("usr/lib64/ld-linux.so"),
        )
        .unwrap();
        fs::write(root.join("usr/lib/x86_64-linux-gnu/libz.so.1.3"), b"z").unwrap();
        symlink(
            "libz.so.1.3",
            root.join("usr/lib/x86_64-linux-gnu/libz.so.1"),
        )
        .unwrap();
        symlink(
            "../lib/x86_64-linux-gnu/libz.so.1.3",
            root.join("usr/lib64/libz-up.so"),
        )
        .unwrap();
        symlink("loop-b", root.join("usr/lib/loop-a")).unwrap();
        symlink("loop-a", root.join("usr/lib/loop-b")).unwrap();
        dir
    }

    #[test]
    fn resolution_stays_inside_the_root() {
        let dir = tree();
        let root = dir.path();
        assert_eq!(
            resolve(root, Path::new("/lib64/ld-linux.so")).unwrap(),
            Path::new("/usr/lib/x86_64-linux-gnu/ld.so")
        );
        assert_eq!(
            resolve(root, Path::new("/../../lib/../lib64")).unwrap(),
            Path::new("/usr/lib64")
        );
        assert!(resolve(root, Path::new("/lib/loop-a")).is_err());
        assert_eq!(
            resolve(root, Path::new("/nope")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn symlink_chains_are_copied_with_real_directories() {
        let dir = tree();
        let root = dir.path();
        let files = host_files(root, Path::new("/lib64/ld-linux.so")).unwrap();
        assert_eq!(
            files,
            [
                HostFile::Regular {
                    path: "/lib/x86_64-linux-gnu/ld.so".into(),
                    source: root.join("usr/lib/x86_64-linux-gnu/ld.so"),
                    mode: 0o755,
                },
                HostFile::Symlink {
                    path: "/lib64/ld-linux.so".into(),
                    target: "/lib/x86_64-linux-gnu/ld.so".into(),
                },
            ]
        );

        let files = host_files(root, Path::new("/lib/x86_64-linux-gnu/libz.so.1")).unwrap();
        assert_eq!(
            files.iter().map(HostFile::path).collect::<Vec<_>>(),
            [
                Path::new("/lib/x86_64-linux-gnu/libz.so.1"),
                Path::new("/lib/x86_64-linux-gnu/libz.so.1.3"),
            ]
        );
        assert!(
            matches!(&files[0], HostFile::Symlink { target, .. } if target == Path::new("libz.so.1.3"))
        );
    }

    #[test]
    fn a_relative_target_that_would_break_in_the_archive_becomes_absolute() {
        let dir = tree();
        let root = dir.path();
        // /lib64/libz-up.so is /usr/lib64/libz-up.so in the tree; its
        // "../lib/..." leads to the same file from /lib64 in the archive.
        let files = host_files(root, Path::new("/lib64/libz-up.so")).unwrap();
        assert!(matches!(&files[1], HostFile::Symlink { target, .. }
            if target == Path::new("../lib/x86_64-linux-gnu/libz.so.1.3")));

        // "../share/zfile" from /usr/lib64 is /usr/share/zfile, but from
        // /lib64 in the archive it would be /share/zfile.
        fs::create_dir_all(root.join("usr/share")).unwrap();
        fs::write(root.join("usr/share/zfile"), b"z").unwrap();
        fs::set_permissions(
            root.join("usr/share/zfile"),
            fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        symlink("../share/zfile", root.join("usr/lib64/libz-deep.so")).unwrap();
        let files = host_files(root, Path::new("/lib64/libz-deep.so")).unwrap();
        assert_eq!(
            files,
            [
                HostFile::Symlink {
                    path: "/lib64/libz-deep.so".into(),
                    target: "/usr/share/zfile".into(),
                },
                HostFile::Regular {
                    path: "/usr/share/zfile".into(),
                    source: root.join("usr/share/zfile"),
                    mode: 0o644,
                },
            ]
        );
    }

    #[test]
    fn loops_directories_and_missing_files_are_errors() {
        let dir = tree();
        let root = dir.path();
        assert!(matches!(
            host_files(root, Path::new("/lib/loop-a")),
            Err(HostError::Io { .. })
        ));
        assert!(matches!(
            host_files(root, Path::new("/lib64")),
            Err(HostError::NotRegular {
                kind: "directory",
                ..
            })
        ));
        let err = host_files(root, Path::new("/lib/nope.so")).unwrap_err();
        assert!(err.is_not_found());
        assert!(
            err.to_string()
                .starts_with("cannot read /lib/nope.so under ")
        );
    }

    #[test]
    fn host_files_go_into_the_archive_at_their_paths() {
        let dir = tree();
        let root = dir.path();
        let mut archive = Archive::new();
        let files = host_files(root, Path::new("/lib64/ld-linux.so")).unwrap();
        add_host_files(&mut archive, &files).unwrap();
        assert_eq!(
            archive.get("lib64/ld-linux.so"),
            Some((
                0o777,
                &crate::Node::Symlink("/lib/x86_64-linux-gnu/ld.so".into())
            ))
        );
        assert_eq!(
            archive.get("lib/x86_64-linux-gnu/ld.so"),
            Some((0o755, &crate::Node::File(b"ld".to_vec())))
        );
        assert_eq!(archive.get("lib"), Some((0o755, &crate::Node::Dir)));
    }
}
