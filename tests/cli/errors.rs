//! The CLI's error cases: one line naming the tensor and what was expected, no output file;
//! the table of bad inputs per subcommand and the files each writes.

use super::*;

/// One bad-input case: the files it writes into a fresh scratch directory, its command line,
/// the kind of error it must fail with and what the error's one line must mention. The failed
/// run must leave the directory as it found it (the same files, unchanged, and no output).
pub(super) struct ErrorCase {
    /// The test's name; consecutive cases of one name form one test.
    pub(super) test: &'static str,
    /// Writes the case's input files.
    files: fn(&Dir) -> TestResult,
    /// The command line, as [`Dir::command`] reads it (`@name`: the scratch directory's file).
    command: &'static str,
    /// The error's kind.
    is: fn(&CliError) -> bool,
    /// What the error's text must contain.
    says: &'static [&'static str],
}

pub(super) const ERROR_CASES: &[ErrorCase] = &[
    ErrorCase {
        test: "errors/missing_tensor",
        files: |d| {
            attention_files(
                d,
                bf16s(2 * 5 * 4 * 64),
                vec![2, 5, 4, 64],
                bf16s(2 * 6 * 2 * 64),
                None,
            )
        },
        command: "attention @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::MissingTensor { .. }),
        says: &[
            "missing tensor `v`",
            "bf16 or f16 or e4m3 [B, Sk, Hkv, D] = [2, 6, 2, 64]",
        ],
    },
    ErrorCase {
        test: "errors/missing_tensor",
        files: |d| backward_files(d, "do", None),
        command: "attention-backward @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::MissingTensor { .. }),
        says: &[
            "missing tensor `do`",
            "bf16 or f16 [B, Sq, Hq, D] = [2, 5, 4, 64]",
        ],
    },
    ErrorCase {
        test: "errors/wrong_dtype",
        files: |d| {
            attention_files(
                d,
                V::F32(vec![0.5; 2 * 5 * 4 * 64]),
                vec![2, 5, 4, 64],
                bf16s(2 * 6 * 2 * 64),
                Some((bf16s(2 * 6 * 2 * 64), vec![2, 6, 2, 64])),
            )
        },
        command: "attention @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Dtype { .. }),
        says: &["tensor `q`", "expected dtype bf16 or f16 or e4m3, got f32"],
    },
    // k and v must have q's dtype.
    ErrorCase {
        test: "errors/wrong_dtype",
        files: |d| {
            attention_files(
                d,
                bf16s(2 * 5 * 4 * 64),
                vec![2, 5, 4, 64],
                V::F16(vec![f16::ONE; 2 * 6 * 2 * 64]),
                Some((bf16s(2 * 6 * 2 * 64), vec![2, 6, 2, 64])),
            )
        },
        command: "attention @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Dtype { .. }),
        says: &["tensor `k`", "bf16 (the dtype of `q`), got f16"],
    },
    // The backward's LSE is f32, its O the dtype of q.
    ErrorCase {
        test: "errors/wrong_dtype",
        files: |d| backward_files(d, "", Some(("lse", vec![2, 4, 5], bf16s(2 * 4 * 5)))),
        command: "attention-backward @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Dtype { .. }),
        says: &["tensor `lse`", "expected dtype f32, got bf16"],
    },
    ErrorCase {
        test: "errors/wrong_dtype",
        files: |d| {
            let o = V::F16(vec![f16::ONE; 2 * 5 * 4 * 64]);
            backward_files(d, "", Some(("o", vec![2, 5, 4, 64], o)))
        },
        command: "attention-backward @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Dtype { .. }),
        says: &["tensor `o`", "bf16 (the dtype of `q`), got f16"],
    },
    ErrorCase {
        test: "errors/wrong_shape",
        files: |d| {
            attention_files(
                d,
                bf16s(2 * 5 * 4 * 64),
                vec![2, 5, 4, 64],
                bf16s(2 * 6 * 2 * 64),
                Some((bf16s(2 * 6 * 2 * 128), vec![2, 6, 2, 128])),
            )
        },
        command: "attention @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Shape { .. }),
        says: &[
            "tensor `v`",
            "[B, Sk, Hkv, D] = [2, 6, 2, 64]",
            "B, D from `q`",
            "Sk, Hkv from `k`",
            "got [2, 6, 2, 128]",
        ],
    },
    // Sinks: one per query head.
    ErrorCase {
        test: "errors/wrong_shape",
        files: |d| {
            let (q, kv) = (vec![2, 5, 4, 64], vec![2, 6, 2, 64]);
            write_inputs(
                &d.path("in.safetensors"),
                &[
                    ("q", q, bf16s(2 * 5 * 4 * 64)),
                    ("k", kv.clone(), bf16s(2 * 6 * 2 * 64)),
                    ("v", kv, bf16s(2 * 6 * 2 * 64)),
                    ("sinks", vec![3], V::F32(vec![0.5; 3])),
                ],
            )
        },
        command: "attention @in.safetensors -o @out.safetensors --reference --softcap 5",
        is: |e| matches!(e, CliError::Shape { .. }),
        says: &["tensor `sinks`", "[Hq] = [4]", "got [3]"],
    },
    // A wrong rank, and a `T + 1` dimension.
    ErrorCase {
        test: "errors/wrong_shape",
        files: |d| {
            write_inputs(
                &d.path("in.safetensors"),
                &[
                    ("cumsum", vec![2, 5], V::F32(vec![0.0; 10])),
                    ("dur", vec![2, 5], V::F32(vec![0.0; 10])),
                    ("trans", vec![5, 5], V::F32(vec![0.0; 25])),
                ],
            )
        },
        command: "semicrf @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Shape { .. }),
        says: &["tensor `cumsum`", "[B, T + 1, C]", "got [2, 5]"],
    },
    // mhc: phi's rows are n C and its columns n^2 + 2n.
    ErrorCase {
        test: "errors/wrong_shape",
        files: |d| {
            let data = MhcData::random(&MhcProblem::new(1, 2, 2, 8), 3);
            let mut t = mhc_tensors(&data, false, false);
            t[1] = ("phi", vec![16, 9], V::F32(vec![0.1; 16 * 9]));
            write_inputs(&d.path("in.safetensors"), &t)
        },
        command: "mhc @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Shape { .. }),
        says: &["tensor `phi`", "[n C, M] = [16, 8]", "got [16, 9]"],
    },
    // The backward: LSE is [B, Hq, Sq] (not [B, Sq, Hq]); dO has Q's shape.
    ErrorCase {
        test: "errors/wrong_shape",
        files: |d| {
            let lse = V::F32(vec![0.0; 2 * 5 * 4]);
            backward_files(d, "", Some(("lse", vec![2, 5, 4], lse)))
        },
        command: "attention-backward @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Shape { .. }),
        says: &["tensor `lse`", "[B, Hq, Sq] = [2, 4, 5]", "got [2, 5, 4]"],
    },
    ErrorCase {
        test: "errors/wrong_shape",
        files: |d| {
            backward_files(
                d,
                "",
                Some(("do", vec![2, 6, 4, 64], bf16s(2 * 6 * 4 * 64))),
            )
        },
        command: "attention-backward @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Shape { .. }),
        says: &[
            "tensor `do`",
            "[B, Sq, Hq, D] = [2, 5, 4, 64]",
            "got [2, 6, 4, 64]",
        ],
    },
    ErrorCase {
        test: "errors/wrong_shape",
        files: |d| {
            let dlse = V::F32(vec![0.0; 2 * 4 * 6]);
            backward_files(d, "", Some(("dlse", vec![2, 4, 6], dlse)))
        },
        command: "attention-backward @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Shape { .. }),
        says: &["tensor `dlse`", "[B, Hq, Sq] = [2, 4, 5]", "got [2, 4, 6]"],
    },
    // The backward's sinks: `[Hq]` f32 (their gradient is written beside dQ, dK, dV); a
    // non-positive softcap is refused.
    ErrorCase {
        test: "errors/wrong_shape",
        files: |d| backward_files(d, "", Some(("sinks", vec![3], V::F32(vec![0.0; 3])))),
        command: "attention-backward @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Shape { .. }),
        says: &["tensor `sinks`", "[Hq] = [4]", "got [3]"],
    },
    ErrorCase {
        test: "errors/bad_softcap",
        files: |d| backward_files(d, "", None),
        command: "attention-backward @in.safetensors -o @out.safetensors --reference --softcap 0",
        is: |e| matches!(e, CliError::Kernel(_)),
        says: &["softcap"],
    },
    ErrorCase {
        test: "errors/unreadable_file",
        files: |_| Ok(()),
        command: "gla @nope.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Read { .. }),
        says: &["cannot read", "nope.safetensors"],
    },
    ErrorCase {
        test: "errors/not_safetensors",
        files: |d| {
            std::fs::write(d.path("in.safetensors"), b"this is not a safetensors file")
                .map_err(|e| e.to_string().into())
        },
        command: "mhc @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Format { .. }),
        says: &["is not a valid safetensors file"],
    },
    ErrorCase {
        test: "errors/unexpected_tensor",
        files: |d| {
            let shape = vec![1, 4, 1, 64];
            let t = || bf16s(4 * 64);
            write_inputs(
                &d.path("in.safetensors"),
                &[
                    ("q", shape.clone(), t()),
                    ("k", shape.clone(), t()),
                    ("g", shape.clone(), t()),
                    ("v", shape, t()),
                    (
                        "initial_states",
                        vec![1, 1, 64, 64],
                        V::F32(vec![0.0; 4096]),
                    ),
                ],
            )
        },
        command: "gla @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::UnexpectedTensor { .. }),
        says: &["unexpected tensor `initial_states`", "initial_state"],
    },
    ErrorCase {
        test: "errors/invalid_values",
        files: |d| crf_files(d, vec![("lengths", vec![2], V::I64(vec![4, 0]))]),
        command: "semicrf-backward @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Kernel(kernels::Error::InvalidArgument { .. })),
        says: &["lengths[1] = 0 is outside 1..=4"],
    },
    ErrorCase {
        test: "errors/invalid_values",
        files: |d| crf_files(d, vec![("lengths", vec![2], V::I64(vec![-3, 4]))]),
        command: "semicrf-backward @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Value { .. }),
        says: &["tensor `lengths`", "element 0 is -3"],
    },
    ErrorCase {
        test: "errors/invalid_values",
        files: |d| crf_files(d, vec![("scores", vec![2, 4, 3], V::F32(vec![0.0; 24]))]),
        command: "semicrf-backward @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Value { .. }),
        says: &["either `cumsum` or `scores`"],
    },
    ErrorCase {
        test: "errors/invalid_values",
        files: |d| crf_files(d, vec![("lengths", vec![2], V::F32(vec![4.0, 4.0]))]),
        command: "semicrf-backward @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Dtype { .. }),
        says: &["tensor `lengths`", "expected dtype i32 or i64, got f32"],
    },
    // cu_seqlens packs the sequences along T: B must be 1.
    ErrorCase {
        test: "errors/invalid_values",
        files: |d| {
            let shape = vec![2, 4, 1, 64];
            let t = || bf16s(2 * 4 * 64);
            write_inputs(
                &d.path("in.safetensors"),
                &[
                    ("q", shape.clone(), t()),
                    ("k", shape.clone(), t()),
                    ("g", shape.clone(), t()),
                    ("v", shape, t()),
                    ("cu_seqlens", vec![3], V::I64(vec![0, 2, 4])),
                ],
            )
        },
        command: "gla @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Shape { .. }),
        says: &["tensor `q`", "B must be 1"],
    },
    ErrorCase {
        test: "errors/unsupported_problem",
        files: |d| {
            let shape = vec![1, 4, 2, 40];
            write_inputs(
                &d.path("in.safetensors"),
                &[
                    ("q", shape.clone(), bf16s(320)),
                    ("k", shape.clone(), bf16s(320)),
                    ("v", shape, bf16s(320)),
                ],
            )
        },
        command: "attention @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Kernel(kernels::Error::Unsupported { .. })),
        says: &["head dimension 40", "32, 48, 64, 80"],
    },
    // attention-decode: the tables are checked on the host before anything runs (a page of a
    // context outside the cache, a negative one, a context past max_pages x page_size), typed
    // like every other input.
    ErrorCase {
        test: "errors/attention_decode_tables",
        files: |d| decode_files(d, &[3, 0, 5, -1, -1, -1, 3, 1, -1], &[37, 0, 29]),
        command: "attention-decode @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Kernel(kernels::Error::InvalidArgument { .. })),
        says: &[
            "block table",
            "page 2 of sequence 0 is 5",
            "outside the cache's 0 .. 5",
        ],
    },
    ErrorCase {
        test: "errors/attention_decode_tables",
        files: |d| decode_files(d, &[3, 0, 4, -1, -1, -1, 3, -1, -1], &[37, 0, 29]),
        command: "attention-decode @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Kernel(kernels::Error::InvalidArgument { .. })),
        says: &["block table", "page 1 of sequence 2 is -1"],
    },
    ErrorCase {
        test: "errors/attention_decode_tables",
        files: |d| decode_files(d, &[3, 0, 4, -1, -1, -1, 3, 1, 2], &[37, 0, 49]),
        command: "attention-decode @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Kernel(kernels::Error::InvalidArgument { .. })),
        says: &[
            "cache_seqlens",
            "sequence 2 has 49 keys",
            "max_pages x page_size = 48",
        ],
    },
    // The tables' dtype and shape, and a page size the kernels do not take.
    ErrorCase {
        test: "errors/attention_decode_tables",
        files: |d| {
            let p = AttentionDecodeProblem::new(3, 1, 4, 2, 64, 16, 5, 3);
            let mut t = decode_tensors(&p, decode_inputs(&p, 1), &[0; 9], V::I32(vec![0; 3]));
            t[3] = ("block_table", vec![3, 3], V::F32(vec![0.0; 9]));
            write_inputs(&d.path("in.safetensors"), &t)
        },
        command: "attention-decode @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Dtype { .. }),
        says: &["tensor `block_table`", "expected dtype i32 or i64, got f32"],
    },
    ErrorCase {
        test: "errors/attention_decode_tables",
        files: |d| {
            let p = AttentionDecodeProblem::new(3, 1, 4, 2, 64, 16, 5, 3);
            let mut t = decode_tensors(&p, decode_inputs(&p, 1), &[0; 9], V::I32(vec![0; 3]));
            t[3] = ("block_table", vec![2, 3], V::I32(vec![0; 6]));
            write_inputs(&d.path("in.safetensors"), &t)
        },
        command: "attention-decode @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Shape { .. }),
        says: &[
            "tensor `block_table`",
            "[B, max_pages] = [3, ?] (B from `q`)",
            "got [2, 3]",
        ],
    },
    ErrorCase {
        test: "errors/attention_decode_tables",
        files: |d| {
            let p = AttentionDecodeProblem::new(3, 1, 4, 2, 64, 8, 5, 3);
            let t = decode_tensors(&p, decode_inputs(&p, 1), &[0; 9], V::I32(vec![0; 3]));
            write_inputs(&d.path("in.safetensors"), &t)
        },
        command: "attention-decode @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Kernel(kernels::Error::Unsupported { .. })),
        says: &["page size 8", "multiple of 16"],
    },
    // The output file already exists: the failed run leaves it as it was.
    ErrorCase {
        test: "errors/existing_output_untouched",
        files: |d| {
            crf_files(d, vec![("lengths", vec![2], V::I32(vec![9, 4]))])?;
            std::fs::write(d.path("out.safetensors"), b"previous output")
                .map_err(|e| e.to_string().into())
        },
        command: "semicrf @in.safetensors -o @out.safetensors --reference",
        is: |e| matches!(e, CliError::Kernel(_)),
        says: &["lengths[0] = 9"],
    },
    ErrorCase {
        test: "errors/output_dir_missing",
        files: |d| crf_files(d, vec![]),
        command: "semicrf @in.safetensors -o @missing/out.safetensors --reference",
        is: |e| matches!(e, CliError::Write { .. }),
        says: &["cannot write", "missing/out.safetensors"],
    },
];

/// Without a GPU the kernel path fails with one line that says so and points at --reference
/// (registered only on machines without a GPU).
pub(super) const NO_GPU_CASE: ErrorCase = ErrorCase {
    test: "no_gpu/kernel_path_fails_cleanly",
    files: |d| crf_files(d, vec![]),
    command: "semicrf @in.safetensors -o @out.safetensors",
    is: |e| matches!(e, CliError::NoGpu { .. }),
    says: &["no usable GPU", "--reference"],
};

/// Each test of [`ERROR_CASES`]: its name and its cases, in the table's order.
pub(super) fn error_tests() -> impl Iterator<Item = (&'static str, &'static [ErrorCase])> {
    ERROR_CASES
        .chunk_by(|a, b| a.test == b.test)
        .map(|cases| (cases[0].test, cases))
}

/// Run `cases` one after the other, each in a fresh scratch directory.
pub(super) fn run_error_cases(cases: &[ErrorCase]) -> TestResult {
    for case in cases {
        let d = Dir::new(&case.test.replace('/', "_"));
        (case.files)(&d)?;
        fails(&d, &d.command(case.command), case.is, case.says)?;
    }
    Ok(())
}

/// Run `args`, expect an error matching `is` whose text is one line and contains every one of
/// `needles`, and check that the directory `d` holds the same files as before the run, each
/// unchanged (no output written, an existing one kept).
pub(super) fn fails(
    d: &Dir,
    args: &[String],
    is: fn(&CliError) -> bool,
    needles: &[&str],
) -> TestResult {
    let before = d.contents()?;
    let e = match cli(args) {
        Ok(_) => return Err(format!("kernels-cli {} succeeded", line(args)).into()),
        Err(e) => e,
    };
    let text = e.to_string();
    println!("error: {text}");
    ensure(is(&e), || format!("unexpected error kind: {e:?}"))?;
    ensure(!text.contains('\n'), || {
        format!("error is not one line: {text:?}")
    })?;
    for n in needles {
        ensure(text.contains(n), || {
            format!("error {text:?} does not mention {n:?}")
        })?;
    }
    ensure(
        d.files() == before.keys().cloned().collect::<Vec<_>>(),
        || {
            format!(
                "directory holds {:?}, expected only {:?}",
                d.files(),
                before.keys()
            )
        },
    )?;
    for (name, bytes) in &before {
        let now = std::fs::read(d.path(name)).map_err(|e| format!("{name}: {e}"))?;
        ensure(&now == bytes, || format!("{name} was changed"))?;
    }
    Ok(())
}

pub(super) fn attention_files(
    d: &Dir,
    q: V,
    qshape: Vec<usize>,
    k: V,
    v: Option<(V, Vec<usize>)>,
) -> TestResult {
    let mut t: Vec<Named> = vec![("q", qshape, q), ("k", vec![2, 6, 2, 64], k)];
    if let Some((v, s)) = v {
        t.push(("v", s, v));
    }
    write_inputs(&d.path("in.safetensors"), &t)
}

/// The inputs of `attention-backward` (B 2, Sq 5, Sk 6, Hq 4, Hkv 2, D 64, bf16) without the
/// tensor named `skip`, with `swap` in place of (or added beside) the tensor of its name.
pub(super) fn backward_files(d: &Dir, skip: &str, swap: Option<Named>) -> TestResult {
    let (q, kv, lse) = (vec![2, 5, 4, 64], vec![2, 6, 2, 64], vec![2, 4, 5]);
    let mut t: Vec<Named> = vec![
        ("q", q.clone(), bf16s(2 * 5 * 4 * 64)),
        ("k", kv.clone(), bf16s(2 * 6 * 2 * 64)),
        ("v", kv, bf16s(2 * 6 * 2 * 64)),
        ("o", q.clone(), bf16s(2 * 5 * 4 * 64)),
        ("lse", lse, V::F32(vec![0.5; 2 * 4 * 5])),
        ("do", q, bf16s(2 * 5 * 4 * 64)),
    ];
    t.retain(|x| x.0 != skip);
    if let Some(x) = swap {
        t.retain(|y| y.0 != x.0);
        t.push(x);
    }
    write_inputs(&d.path("in.safetensors"), &t)
}

/// The inputs of `attention-decode` (B 3, Sq 1, Hq 4, Hkv 2, D 64, 5 pages of 16, 3 per
/// sequence; bf16) with the block table `table` and the context lengths `lens`.
pub(super) fn decode_files(d: &Dir, table: &[i32], lens: &[i32]) -> TestResult {
    let p = AttentionDecodeProblem::new(3, 1, 4, 2, 64, 16, 5, 3);
    let t = decode_tensors(&p, decode_inputs(&p, 2), table, V::I32(lens.to_vec()));
    write_inputs(&d.path("in.safetensors"), &t)
}

pub(super) fn bf16s(n: usize) -> V {
    V::Bf16(uniform_bf16(&mut rng(1), n, -1.0, 1.0))
}

pub(super) fn crf_files(d: &Dir, extra: Vec<Named>) -> TestResult {
    let mut t: Vec<Named> = vec![
        ("cumsum", vec![2, 5, 3], V::F32(vec![0.0; 30])),
        ("dur", vec![2, 3], V::F32(vec![0.0; 6])),
        ("trans", vec![3, 3], V::F32(vec![0.0; 9])),
    ];
    t.extend(extra);
    write_inputs(&d.path("in.safetensors"), &t)
}
