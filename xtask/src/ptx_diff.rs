//! `ptx-diff BASE`: is every kernel's PTX the same as at commit `BASE`, up to the names of
//! virtual registers and labels?
//!
//! The PTX of `BASE` is built by `BASE`'s own `build-ptx` (from a `git archive` of it under
//! `target/ptx-diff/<commit>/`, kept as a cache), the working tree's by the current one. Each
//! kernel's body is normalized before the comparison: virtual registers (`%r12`, `%rd3`, `%p7`,
//! ...), labels (`$L__BB3_17`) and local frames (`__local_depot66`, numbered by the kernel's place
//! in the module) are renamed in order of first appearance, the register counts
//! of `.reg` declarations dropped, and mangled Rust symbols (`_R...`, which carry a crate hash)
//! replaced by one name. Everything outside the kernels (module header, shared-memory and global
//! declarations, functions) is compared the same way, as a multiset of lines. Two kernels are
//! reported equal only if their normalized texts are identical, line for line.

use crate::ptx;
use crate::util::{self, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::Command;

/// Compare the PTX of every target with `BASE`'s; fail on any difference.
pub fn ptx_diff(args: &[String]) -> Result {
    let Some(base) = args.first() else {
        return Err("usage: ptx-diff BASE (a commit, e.g. HEAD~1 or main)".into());
    };
    let sha = util::output(Command::new("git").current_dir(util::root()).args([
        "rev-parse",
        "--verify",
        &format!("{base}^{{commit}}"),
    ]))?
    .trim()
    .to_string();
    let base_dir = util::root().join("target").join("ptx-diff").join(&sha);
    let base_ptx = base_dir.join("target").join("ptx");
    if !base_ptx.join("done").is_file() {
        build_base(&sha, &base_dir)?;
        util::write(&base_ptx.join("done"), &sha)?;
    }
    let built = ptx::build()?;
    let mut failures = Vec::new();
    let mut summary = Vec::new();
    for (target, path) in &built {
        let file = path.file_name().expect("a PTX file name");
        let old = util::read(&base_ptx.join(file))?;
        let new = util::read(path)?;
        let report = compare(&old, &new);
        summary.push(format!(
            "{:<7} {} kernels identical, {} different, {} only in {base}, {} only in the working tree; \
             module-level lines {}",
            target.cpu,
            report.identical,
            report.different.len(),
            report.only_old.len(),
            report.only_new.len(),
            if report.module_equal {
                "identical"
            } else {
                "different"
            },
        ));
        for (kernel, detail) in &report.different {
            failures.push(format!("{} {kernel}: {detail}", target.cpu));
        }
        for k in &report.only_old {
            failures.push(format!("{} {k}: missing from the working tree", target.cpu));
        }
        for k in &report.only_new {
            failures.push(format!("{} {k}: not in {base}", target.cpu));
        }
        if !report.module_equal {
            failures.push(format!(
                "{}: module-level lines differ: {}",
                target.cpu, report.module_detail
            ));
        }
    }
    println!("ptx-diff against {base} ({sha}):");
    for line in &summary {
        println!("  {line}");
    }
    if failures.is_empty() {
        println!("ptx-diff: every kernel's PTX is identical up to register and label names");
        Ok(())
    } else {
        for f in &failures {
            println!("  {f}");
        }
        Err(format!("{} differences", failures.len()))
    }
}

/// Extract commit `sha` into `dir` and run its own `build-ptx` there.
fn build_base(sha: &str, dir: &Path) -> Result {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    }
    util::create_dir(dir)?;
    let archive = Command::new("git")
        .current_dir(util::root())
        .args(["archive", "--format=tar", sha])
        .output()
        .map_err(|e| format!("git archive: {e}"))?;
    if !archive.status.success() {
        return Err(format!("git archive {sha} failed"));
    }
    let tar = dir.join("base.tar");
    std::fs::write(&tar, &archive.stdout).map_err(|e| format!("writing {}: {e}", tar.display()))?;
    util::run(Command::new("tar").arg("-xf").arg(&tar).arg("-C").arg(dir))?;
    let _ = std::fs::remove_file(&tar);
    util::run(
        Command::new(util::cargo())
            .current_dir(dir)
            .args([
                "run",
                "--quiet",
                "--release",
                "--package",
                "xtask",
                "--",
                "build-ptx",
            ])
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS"),
    )
}

/// The outcome of comparing two PTX modules.
#[derive(Debug, Default)]
struct Report {
    identical: usize,
    different: Vec<(String, String)>,
    only_old: Vec<String>,
    only_new: Vec<String>,
    module_equal: bool,
    module_detail: String,
}

fn compare(old: &str, new: &str) -> Report {
    let (old_kernels, old_module) = split(old);
    let (new_kernels, new_module) = split(new);
    let mut report = Report::default();
    for (name, body) in &old_kernels {
        match new_kernels.get(name) {
            None => report.only_old.push(name.clone()),
            Some(other) => {
                let (a, b) = (normalize(body), normalize(other));
                if a == b {
                    report.identical += 1;
                } else {
                    report
                        .different
                        .push((name.clone(), first_difference(&a, &b)));
                }
            }
        }
    }
    report.only_new = new_kernels
        .keys()
        .filter(|k| !old_kernels.contains_key(*k))
        .cloned()
        .collect();
    let mut a: Vec<String> = normalize(&old_module).lines().map(str::to_string).collect();
    let mut b: Vec<String> = normalize(&new_module).lines().map(str::to_string).collect();
    a.sort();
    b.sort();
    report.module_equal = a == b;
    if !report.module_equal {
        let only_a: Vec<&String> = a.iter().filter(|l| !b.contains(l)).take(3).collect();
        let only_b: Vec<&String> = b.iter().filter(|l| !a.contains(l)).take(3).collect();
        report.module_detail =
            format!("only in the base: {only_a:?}; only in the tree: {only_b:?}");
    }
    report
}

/// The kernels (`.entry` bodies by name) and the rest of a module. A kernel runs from its
/// `.entry` line to the `}` that closes its body (braces are counted: bodies hold nested `{ }`
/// scopes, some at the start of a line; comments are left out of the count).
fn split(ptx: &str) -> (BTreeMap<String, String>, String) {
    let mut kernels = BTreeMap::new();
    let mut module = String::new();
    // The kernel being read: name, text, brace depth, whether its body has opened.
    let mut current: Option<(String, String, i64, bool)> = None;
    for line in ptx.lines() {
        let t = line.trim();
        if current.is_none()
            && let Some(rest) = t
                .strip_prefix(".visible .entry ")
                .or(t.strip_prefix(".entry "))
        {
            let name = rest.split('(').next().unwrap_or("").trim().to_string();
            current = Some((name, String::new(), 0, false));
        }
        match &mut current {
            Some((_, body, depth, opened)) => {
                body.push_str(line);
                body.push('\n');
                let code = line.split("//").next().unwrap_or("");
                for c in code.chars() {
                    match c {
                        '{' => {
                            *depth += 1;
                            *opened = true;
                        }
                        '}' => *depth -= 1,
                        _ => {}
                    }
                }
                if *opened && *depth == 0 {
                    let (name, body, _, _) = current.take().expect("inside a kernel");
                    kernels.insert(name, body);
                }
            }
            None => {
                module.push_str(line);
                module.push('\n');
            }
        }
    }
    (kernels, module)
}

/// Rename virtual registers and labels in order of first appearance, drop `.reg` counts and
/// mangled-symbol hashes.
/// The prefix of a kernel's local frame symbol.
const DEPOT: [char; 13] = [
    '_', '_', 'l', 'o', 'c', 'a', 'l', '_', 'd', 'e', 'p', 'o', 't',
];

fn normalize(text: &str) -> String {
    let mut names: HashMap<String, String> = HashMap::new();
    let mut counters: HashMap<String, usize> = HashMap::new();
    let mut out = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$';
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let prev_ident = i > 0 && ident(chars[i - 1]);
        if c == '%' && !prev_ident {
            // `%` letters digits: a virtual register; `%` letters `<` digits `>`: a declaration.
            let mut j = i + 1;
            while j < chars.len() && chars[j].is_ascii_lowercase() {
                j += 1;
            }
            let class: String = chars[i + 1..j].iter().collect();
            if j < chars.len() && chars[j] == '<' {
                let mut k = j + 1;
                while k < chars.len() && chars[k].is_ascii_digit() {
                    k += 1;
                }
                if k < chars.len() && chars[k] == '>' && k > j + 1 {
                    out.push_str(&format!("%{class}<N>"));
                    i = k + 1;
                    continue;
                }
            }
            let mut k = j;
            while k < chars.len() && chars[k].is_ascii_digit() {
                k += 1;
            }
            if j > i + 1 && k > j && (k == chars.len() || !ident(chars[k])) {
                let token: String = chars[i..k].iter().collect();
                out.push_str(&rename(
                    &mut names,
                    &mut counters,
                    &token,
                    &format!("%{class}"),
                ));
                i = k;
                continue;
            }
        }
        if c == '$' && !prev_ident && chars[i..].starts_with(&['$', 'L', '_', '_']) {
            let mut k = i + 1;
            while k < chars.len() && ident(chars[k]) {
                k += 1;
            }
            let token: String = chars[i..k].iter().collect();
            out.push_str(&rename(&mut names, &mut counters, &token, "$L"));
            i = k;
            continue;
        }
        if c == '_' && !prev_ident && chars[i..].starts_with(&DEPOT) {
            // `__local_depot<N>`: LLVM numbers a kernel's local frame by its index in the
            // module, so adding a kernel before it renames it.
            let mut k = i + DEPOT.len();
            while k < chars.len() && chars[k].is_ascii_digit() {
                k += 1;
            }
            if k > i + DEPOT.len() && (k == chars.len() || !ident(chars[k])) {
                let token: String = chars[i..k].iter().collect();
                out.push_str(&rename(&mut names, &mut counters, &token, "__local_depot"));
                i = k;
                continue;
            }
        }
        if c == '_'
            && !prev_ident
            && i + 2 < chars.len()
            && chars[i + 1] == 'R'
            && chars[i + 2].is_ascii_alphanumeric()
        {
            let mut k = i + 1;
            while k < chars.len() && ident(chars[k]) {
                k += 1;
            }
            out.push_str("_R#");
            i = k;
            continue;
        }
        out.push(c);
        i += 1;
    }
    out
}

fn rename(
    names: &mut HashMap<String, String>,
    counters: &mut HashMap<String, usize>,
    token: &str,
    class: &str,
) -> String {
    if let Some(n) = names.get(token) {
        return n.clone();
    }
    let count = counters.entry(class.to_string()).or_insert(0);
    let name = format!("{class}#{count}");
    *count += 1;
    names.insert(token.to_string(), name.clone());
    name
}

/// Where two normalized kernel texts first differ.
fn first_difference(a: &str, b: &str) -> String {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    for (i, (x, y)) in la.iter().zip(&lb).enumerate() {
        if x != y {
            return format!(
                "line {} of {} / {}: {:?} vs {:?}",
                i + 1,
                la.len(),
                lb.len(),
                x.trim(),
                y.trim()
            );
        }
    }
    format!(
        "{} lines vs {} (one is a prefix of the other)",
        la.len(),
        lb.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renaming_makes_register_and_label_names_irrelevant() {
        let a = ".reg .b32 %r<9>;\nadd.s32 %r3, %r1, %r2;\n@%p1 bra $L__BB0_2;\n$L__BB0_2:\nmov.u32 %r4, %tid.x;\n";
        let b = ".reg .b32 %r<12>;\nadd.s32 %r7, %r5, %r6;\n@%p4 bra $L__BB7_9;\n$L__BB7_9:\nmov.u32 %r8, %tid.x;\n";
        assert_eq!(normalize(a), normalize(b));
        assert!(
            normalize(a).contains("%tid.x"),
            "special registers keep their names"
        );
    }

    #[test]
    fn local_frames_are_renamed() {
        let a = ".local .align 8 .b8 \t__local_depot66[40];\nmov.u64 %SPL, __local_depot66;\n";
        let b = ".local .align 8 .b8 \t__local_depot72[40];\nmov.u64 %SPL, __local_depot72;\n";
        assert_eq!(normalize(a), normalize(b));
        let c = ".local .align 8 .b8 \t__local_depot72[48];\n";
        assert_ne!(normalize(a).lines().next(), normalize(c).lines().next());
    }

    #[test]
    fn a_different_operand_order_is_a_difference() {
        let a = "add.s32 %r3, %r1, %r2;\nsub.s32 %r4, %r1, %r2;\n";
        let b = "add.s32 %r3, %r1, %r2;\nsub.s32 %r4, %r2, %r1;\n";
        assert_ne!(normalize(a), normalize(b));
    }

    #[test]
    fn kernels_are_compared_by_name_whatever_their_order() {
        let m1 = ".version 8.0\n.visible .entry a(\n)\n{\nret;\n}\n.visible .entry b(\n)\n{\nadd.s32 %r1, %r2, 1;\n}\n";
        let m2 = ".version 8.0\n.visible .entry b(\n)\n{\nadd.s32 %r5, %r9, 1;\n}\n.visible .entry a(\n)\n{\nret;\n}\n";
        let r = compare(m1, m2);
        assert_eq!(r.identical, 2);
        assert!(r.different.is_empty() && r.module_equal);
        let m3 = m2.replace("1;", "2;");
        let r = compare(m1, &m3);
        assert_eq!(r.different.len(), 1);
        assert_eq!(r.different[0].0, "b");
    }

    #[test]
    fn nested_scopes_stay_inside_their_kernel() {
        let m1 = ".visible .entry a(\n)\n{\n{\nadd.s32 %r1, %r2, 1;\n}\nsub.s32 %r3, %r1, 1;\n}\n";
        let m2 = ".visible .entry a(\n)\n{\n{\nadd.s32 %r1, %r2, 1;\n}\nsub.s32 %r3, %r1, 2;\n}\n";
        let (kernels, module) = split(m1);
        assert!(
            module.is_empty(),
            "everything belongs to the kernel: {module:?}"
        );
        assert!(kernels["a"].contains("sub.s32"));
        let r = compare(m1, m2);
        assert_eq!(
            r.different.len(),
            1,
            "a difference after a nested scope is seen"
        );
    }

    #[test]
    fn mangled_symbols_lose_their_hash() {
        assert_eq!(
            normalize("call _RNvCsabc_7___rustc17rust_begin_unwind;"),
            normalize("call _RNvCsxyz_7___rustc17rust_begin_unwind;")
        );
    }
}
