//! File lookups inside a driver root, with symlinks resolved as if the root were `/`.
//!
//! The driver root is often another filesystem tree (the GPU Operator's driver container);
//! an absolute symlink in it (`lib -> /usr/lib`) must resolve inside that tree, not in the
//! plugin's own filesystem. All paths handed out are root-relative and start with `/`.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

/// Linux's own limit on symlinks followed while resolving one path.
const MAX_SYMLINKS: usize = 40;

/// A directory tree treated as a root filesystem.
#[derive(Debug, Clone, Copy)]
pub struct RootFs<'a> {
    root: &'a Path,
}

/// What kind of file a lookup accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Anything but a directory (libraries, configs, sockets).
    NonDir,
    /// A non-directory with any execute bit.
    Executable,
}

impl<'a> RootFs<'a> {
    pub fn new(root: &'a Path) -> Self {
        RootFs { root }
    }

    /// The plugin-visible path of a root-relative path.
    pub fn host(&self, path: &Path) -> PathBuf {
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }

    /// Resolves every symlink in root-relative `path` inside the root. `Ok(None)` when the
    /// path (or a link target) does not exist.
    ///
    /// # Errors
    /// I/O errors other than "not found"/"not a directory", and an error after following
    /// [`MAX_SYMLINKS`] links.
    pub fn resolve(&self, path: &Path) -> io::Result<Option<PathBuf>> {
        let mut pending: VecDeque<OsString> = components(path).into();
        let mut resolved = PathBuf::from("/");
        let mut followed = 0;
        while let Some(part) = pending.pop_front() {
            if part == ".." {
                resolved.pop();
                continue;
            }
            let candidate = resolved.join(&part);
            let meta = match fs::symlink_metadata(self.host(&candidate)) {
                Ok(meta) => meta,
                Err(e) if is_absent(&e) => return Ok(None),
                Err(e) => return Err(e),
            };
            if !meta.file_type().is_symlink() {
                resolved = candidate;
                continue;
            }
            followed += 1;
            if followed > MAX_SYMLINKS {
                return Err(io::Error::other(format!(
                    "more than {MAX_SYMLINKS} symlinks (a symlink loop?)"
                )));
            }
            let target = fs::read_link(self.host(&candidate))?;
            if target.is_absolute() {
                resolved = PathBuf::from("/");
            }
            for part in components(&target).into_iter().rev() {
                pending.push_front(part);
            }
        }
        Ok(Some(resolved))
    }

    /// Resolves `path` and checks it is the wanted kind of file; `Ok(None)` otherwise.
    ///
    /// # Errors
    /// As [`RootFs::resolve`], plus stat failures of the resolved file.
    pub fn find(&self, path: &Path, want: Want) -> io::Result<Option<PathBuf>> {
        let Some(resolved) = self.resolve(path)? else {
            return Ok(None);
        };
        let meta = fs::metadata(self.host(&resolved))?;
        let ok = !meta.is_dir() && (want == Want::NonDir || meta.permissions().mode() & 0o111 != 0);
        Ok(ok.then_some(resolved))
    }

    /// Files in directory `dir` whose names match `pattern` (`*` wildcards), sorted by name,
    /// each resolved; non-matching kinds and dangling links are skipped. A missing
    /// directory yields nothing.
    ///
    /// # Errors
    /// As [`RootFs::find`], plus directory listing failures.
    pub fn glob(&self, dir: &Path, pattern: &str) -> io::Result<Vec<PathBuf>> {
        let Some(dir) = self.resolve(dir)? else {
            return Ok(Vec::new());
        };
        let entries = match fs::read_dir(self.host(&dir)) {
            Ok(entries) => entries,
            Err(e) if is_absent(&e) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut names = Vec::new();
        for entry in entries {
            let name = entry?.file_name();
            if name.to_str().is_some_and(|n| wildcard_match(pattern, n)) {
                names.push(name);
            }
        }
        names.sort();
        let mut found = Vec::new();
        for name in names {
            if let Some(path) = self.find(&dir.join(name), Want::NonDir)? {
                found.push(path);
            }
        }
        Ok(found)
    }

    /// Symlinks directly inside root-relative `dir`, as (link name, link text) pairs sorted
    /// by name.
    ///
    /// # Errors
    /// Directory listing or readlink failures other than a missing directory.
    pub fn symlinks_in(&self, dir: &Path) -> io::Result<Vec<(String, PathBuf)>> {
        let entries = match fs::read_dir(self.host(dir)) {
            Ok(entries) => entries,
            Err(e) if is_absent(&e) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut links = Vec::new();
        for entry in entries {
            let entry = entry?;
            if entry.file_type()?.is_symlink()
                && let Some(name) = entry.file_name().to_str()
            {
                links.push((name.to_string(), fs::read_link(entry.path())?));
            }
        }
        links.sort();
        Ok(links)
    }
}

fn is_absent(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

fn components(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(part) => Some(part.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// Shell-style matching where `*` stands for any run of characters (no other specials).
pub fn wildcard_match(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn wildcards_match_like_a_shell_glob() {
        let cases = [
            ("libcuda.so.*.*", "libcuda.so.580.65.06", true),
            ("libcuda.so.*.*", "libcuda.so.1", false),
            ("*.so.580.65.06", "libnvidia-ml.so.580.65.06", true),
            ("gsp*.bin", "gsp_ga10x.bin", true),
            ("gsp*.bin", "gsp.bin", true),
            ("a*a", "a", false),
            ("exact", "exact", true),
        ];
        for (pattern, name, want) in cases {
            assert_eq!(wildcard_match(pattern, name), want, "{pattern} vs {name}");
        }
    }

    #[test]
    fn absolute_symlinks_resolve_inside_the_root() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu")).unwrap();
        fs::write(
            root.join("usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06"),
            b"",
        )
        .unwrap();
        symlink("/usr/lib", root.join("lib")).unwrap();
        symlink(
            "libcuda.so.580.65.06",
            root.join("usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        )
        .unwrap();
        let fs = RootFs::new(root);
        let got = fs
            .resolve(Path::new("/lib/x86_64-linux-gnu/libcuda.so.1"))
            .unwrap();
        let want = Some(PathBuf::from(
            "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06",
        ));
        assert_eq!(got, want);
    }

    #[test]
    fn symlink_loops_are_an_error_not_a_hang() {
        let tmp = tempfile::tempdir().unwrap();
        symlink("b", tmp.path().join("a")).unwrap();
        symlink("a", tmp.path().join("b")).unwrap();
        let err = RootFs::new(tmp.path())
            .resolve(Path::new("/a"))
            .unwrap_err();
        assert!(err.to_string().contains("symlink loop"), "got {err}");
    }

    #[test]
    fn find_checks_execute_bits_and_skips_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::create_dir_all(root.join("bin/dir")).unwrap();
        fs::write(root.join("bin/plain"), b"").unwrap();
        fs::write(root.join("bin/tool"), b"").unwrap();
        fs::set_permissions(root.join("bin/tool"), fs::Permissions::from_mode(0o755)).unwrap();
        let fs = RootFs::new(root);
        let got: Vec<bool> = ["/bin/tool", "/bin/plain", "/bin/dir", "/bin/missing"]
            .iter()
            .map(|p| fs.find(Path::new(p), Want::Executable).unwrap().is_some())
            .collect();
        assert_eq!(got, vec![true, false, false, false]);
    }
}
