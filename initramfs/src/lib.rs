//! Reproducible initramfs images.
//!
//! This crate owns the ramdisk format: an in-memory [`Archive`] written as a
//! cpio "newc" archive, optionally compressed ([`Compression`]); a
//! [`reader`] that takes images apart again (for tests and for inspecting
//! what a node booted); the ELF dependency closure of dynamic programs
//! ([`elf`]); and kernel modules with their dependencies ([`modules`]).
//! It decides nothing about *what* goes into an image: the `image` crate
//! chooses the files (the static `bcd` as `/init`, udev rules, `nft` and its
//! libraries, the network modules) and signs the result; the whole-system
//! tests boot it in qemu. It never writes to the host: files are read from
//! a root directory given as a parameter (`/`, or a sysroot in tests), and
//! the image is returned as bytes.
//!
//! # Format choices
//!
//! - **newc.** The kernel's unpacker (`init/initramfs.c`) reads cpio in the
//!   SVR4 "new ASCII" format only: magic `070701`, or `070702` whose
//!   `check` field sums the data bytes. We write `070701`.
//! - **Relative names.** Names are stored as `bin/bcd`, as `find . | cpio
//!   -o -H newc` stores them. The kernel unpacks relative to the rootfs
//!   root and accepts `/bin/bcd` as well; the reader returns names as
//!   stored.
//! - **Parents first, sorted.** The kernel creates each entry with a plain
//!   `mkdir`/`open`/`symlink`/`mknod` and does not create missing parents,
//!   so every parent directory is an entry of its own and comes before what
//!   is inside it. Entries are sorted by path, component by component, so
//!   the bytes do not depend on the order in which files were added.
//! - **Fixed metadata.** uid and gid are 0, every entry has the same mtime
//!   (0 unless set, as `SOURCE_DATE_EPOCH` would set it) and inode numbers
//!   count from 1 in output order. The same inputs give byte-identical
//!   images, so a signed manifest can name an image by its digest and a
//!   rebuild can be checked against it. Files have `nlink` 1: the kernel
//!   treats a non-directory with `nlink` of 2 or more as a hard link
//!   candidate.
//! - **Padding.** Names and data are padded to 4 bytes as the format
//!   requires, the archive ends with `TRAILER!!!` and is padded with zeros
//!   to 512 bytes, as GNU cpio and the kernel's `gen_init_cpio` do.
//! - **Concatenation.** The kernel accepts several archives one after the
//!   other, each uncompressed or separately compressed, with zero padding
//!   between them; an uncompressed archive must start on a 4-byte boundary.
//!   The reader follows the same rules.
//! - **Compression.** gzip and zstd, which every kernel we boot unpacks;
//!   both outputs are deterministic (no time or name in the gzip header,
//!   single-threaded zstd with a fixed level).
//!
//! # What the kernel needs from an image
//!
//! An executable `/init` (or the path given by `rdinit=`), and
//! `/dev/console` (character device 5:1) so that `/init` starts with a
//! console: the kernel opens it before running `/init`.
//!
//! # Kernel modules
//!
//! Modules are copied as they are in `/lib/modules/<kver>`, compressed or
//! not, with a `modules.dep` for just those modules and a load list,
//! `modules.order`, in dependency order. The init loads them in that order
//! with `finit_module`, which takes a compressed module only when the
//! kernel was built with `CONFIG_MODULE_DECOMPRESS` (the init passes
//! `MODULE_INIT_COMPRESSED_FILE`); busybox's `insmod` may not read `.ko.xz`
//! at all. Debian's kernels ship uncompressed `.ko` files.
#![forbid(unsafe_code)]

mod archive;
mod compress;
pub mod elf;
mod host;
pub mod modules;
pub mod newc;
pub mod reader;

pub use archive::{Archive, BLOCK_LEN, BuildError, IMPLICIT_DIR_PERM};
pub use compress::{Compression, UnknownCompression};
pub use elf::{Closure, ElfError, add_program};
pub use host::{HostError, HostFile, add_host_files, host_files};
pub use modules::{LoadPlan, Module, ModuleError, Modules, add_modules};
pub use newc::Node;
pub use reader::{Entry, ReadError, Reader, Segment, read};
