//! Reading inputs from and writing outputs to safetensors files.
//!
//! Inputs are checked tensor by tensor against a symbolic shape (`[B, T + 1, C]`): the first
//! tensor that mentions a dimension fixes it, later ones must agree, and every error names the
//! tensor, the expected dtype or shape (with the values known so far and where they came from)
//! and what the file holds. Outputs are written to a temporary file in the output's directory
//! and renamed over the output only once everything succeeded.

use crate::error::{CliError, Result};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The name of a safetensors dtype as PyTorch users write it (`bf16`, `f32`, `i64`).
pub fn dtype_name(d: Dtype) -> String {
    match d {
        Dtype::BOOL => "bool".into(),
        Dtype::U8 => "u8".into(),
        Dtype::I8 => "i8".into(),
        Dtype::I16 => "i16".into(),
        Dtype::U16 => "u16".into(),
        Dtype::F16 => "f16".into(),
        Dtype::BF16 => "bf16".into(),
        Dtype::I32 => "i32".into(),
        Dtype::U32 => "u32".into(),
        Dtype::F32 => "f32".into(),
        Dtype::F64 => "f64".into(),
        Dtype::I64 => "i64".into(),
        Dtype::U64 => "u64".into(),
        Dtype::F8_E4M3 => "e4m3".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

fn dtypes_text(ds: &[Dtype]) -> String {
    ds.iter()
        .map(|&d| dtype_name(d))
        .collect::<Vec<_>>()
        .join(" or ")
}

/// One dimension of an expected shape.
#[derive(Clone, Copy, Debug)]
pub enum Dim {
    /// A named dimension (`B`): fixed by the first tensor that has it.
    Var(&'static str),
    /// One more than a named dimension (`T + 1`).
    Succ(&'static str),
    /// A dimension computed from others or fixed by the format, with its label (`n C`, `3`).
    Is(&'static str, usize),
}

/// `[B, T + 1, C]`.
fn symbolic(dims: &[Dim]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| match d {
            Dim::Var(n) => n.to_string(),
            Dim::Succ(n) => format!("{n} + 1"),
            Dim::Is(label, _) => label.to_string(),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

fn shape_text(shape: &[usize]) -> String {
    format!("{shape:?}")
}

/// One input tensor: its dtype, shape and little-endian bytes.
#[derive(Clone, Debug)]
pub struct Tensor {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl Tensor {
    /// The dtype.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn words<const N: usize>(&self) -> impl Iterator<Item = [u8; N]> + '_ {
        self.bytes
            .chunks_exact(N)
            .map(|c| c.try_into().expect("chunks of N bytes"))
    }

    /// The raw bytes of a one-byte tensor (u8, e4m3; the dtype was checked when it was taken).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The values of a bf16 tensor (the dtype was checked when it was taken).
    pub fn bf16(&self) -> Vec<bf16> {
        debug_assert_eq!(self.dtype, Dtype::BF16);
        self.words::<2>().map(bf16::from_le_bytes).collect()
    }

    /// The values of an f16 tensor.
    pub fn f16(&self) -> Vec<f16> {
        debug_assert_eq!(self.dtype, Dtype::F16);
        self.words::<2>().map(f16::from_le_bytes).collect()
    }

    /// The values of an f32 tensor.
    pub fn f32(&self) -> Vec<f32> {
        debug_assert_eq!(self.dtype, Dtype::F32);
        self.words::<4>().map(f32::from_le_bytes).collect()
    }

    /// The values of an i32 or i64 tensor as i64.
    pub fn int(&self) -> Vec<i64> {
        match self.dtype {
            Dtype::I32 => self
                .words::<4>()
                .map(|w| i32::from_le_bytes(w) as i64)
                .collect(),
            _ => self.words::<8>().map(i64::from_le_bytes).collect(),
        }
    }

    /// The values of an integer tensor as `u32`, each checked to be in `0..=u32::MAX`.
    pub fn u32(&self) -> Result<Vec<u32>> {
        self.int()
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                u32::try_from(v).map_err(|_| CliError::Value {
                    name: self.name.clone(),
                    reason: format!("element {i} is {v}, expected a value in 0..=4294967295"),
                })
            })
            .collect()
    }
}

/// The tensors of an input file, taken one by one by a subcommand.
#[derive(Debug)]
pub struct Inputs {
    tensors: BTreeMap<String, Tensor>,
    /// Dimensions fixed so far: name -> (value, tensor or option that fixed it).
    dims: HashMap<&'static str, (usize, String)>,
}

impl Inputs {
    /// Read and parse `path` (the whole file; tensor data is copied out).
    pub fn open(path: &Path) -> Result<Inputs> {
        let bytes = std::fs::read(path).map_err(|source| CliError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| CliError::Format {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let tensors = st
            .iter()
            .map(|(name, view)| {
                let t = Tensor {
                    name: name.to_string(),
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    bytes: view.data().to_vec(),
                };
                (name.to_string(), t)
            })
            .collect();
        Ok(Inputs {
            tensors,
            dims: HashMap::new(),
        })
    }

    /// Whether the file has tensor `name` (not yet taken).
    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The shape of tensor `name` (not yet taken), if the file has it.
    pub fn shape_of(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).map(|t| t.shape.as_slice())
    }

    /// The value of dimension `name`, once a tensor fixed it.
    pub fn dim(&self, name: &str) -> Option<usize> {
        self.dims.get(name).map(|(v, _)| *v)
    }

    /// Fix dimension `name` to `value` (from an option or another dimension, `source`).
    pub fn bind(&mut self, name: &'static str, value: usize, source: &str) {
        self.dims.insert(name, (value, source.to_string()));
    }

    /// Take required tensor `name` with one of `dtypes` and shape `dims`.
    pub fn take(&mut self, name: &str, dtypes: &[Dtype], dims: &[Dim]) -> Result<Tensor> {
        self.take_opt(name, dtypes, dims)?
            .ok_or_else(|| CliError::MissingTensor {
                name: name.to_string(),
                expected: format!("{} {}", dtypes_text(dtypes), self.expected(dims)),
            })
    }

    /// Take optional tensor `name` (checked as [`Inputs::take`] when present).
    pub fn take_opt(
        &mut self,
        name: &str,
        dtypes: &[Dtype],
        dims: &[Dim],
    ) -> Result<Option<Tensor>> {
        let Some(t) = self.tensors.remove(name) else {
            return Ok(None);
        };
        if !dtypes.contains(&t.dtype) {
            return Err(CliError::Dtype {
                name: name.to_string(),
                expected: dtypes_text(dtypes),
                got: dtype_name(t.dtype),
            });
        }
        self.check_shape(name, &t.shape, dims)?;
        Ok(Some(t))
    }

    /// `[B, Sk, Hkv, D] = [2, ?, ?, 64] (B, D from `q`)`: the symbolic shape, with the values
    /// known so far and where they came from.
    fn expected(&self, dims: &[Dim]) -> String {
        let mut known = false;
        let mut sources: Vec<(String, String)> = Vec::new();
        let values: Vec<String> = dims
            .iter()
            .map(|d| {
                let (name, add) = match *d {
                    Dim::Var(n) => (n, 0),
                    Dim::Succ(n) => (n, 1),
                    Dim::Is(_, v) => {
                        known = true;
                        return v.to_string();
                    }
                };
                match self.dims.get(name) {
                    Some((v, src)) => {
                        known = true;
                        if !sources.iter().any(|(n, _)| n == name) {
                            sources.push((name.to_string(), src.clone()));
                        }
                        (v + add).to_string()
                    }
                    None => "?".to_string(),
                }
            })
            .collect();
        let mut text = symbolic(dims);
        if known {
            text += &format!(" = [{}]", values.join(", "));
        }
        if !sources.is_empty() {
            // Group the dimensions by where they came from: "(B, D from `q`; C from `dur`)".
            let mut groups: Vec<(String, Vec<String>)> = Vec::new();
            for (n, src) in sources {
                match groups.iter_mut().find(|(s, _)| *s == src) {
                    Some((_, names)) => names.push(n),
                    None => groups.push((src, vec![n])),
                }
            }
            let parts: Vec<String> = groups
                .into_iter()
                .map(|(src, names)| format!("{} from {src}", names.join(", ")))
                .collect();
            text += &format!(" ({})", parts.join("; "));
        }
        text
    }

    fn check_shape(&mut self, name: &str, shape: &[usize], dims: &[Dim]) -> Result<()> {
        let mismatch = |this: &Inputs| CliError::Shape {
            name: name.to_string(),
            expected: this.expected(dims),
            got: shape_text(shape),
        };
        if shape.len() != dims.len() {
            return Err(mismatch(self));
        }
        let mut fresh: Vec<(&'static str, usize)> = Vec::new();
        for (d, &got) in dims.iter().zip(shape) {
            let (var, value) = match *d {
                Dim::Is(_, v) => {
                    if got != v {
                        return Err(mismatch(self));
                    }
                    continue;
                }
                Dim::Var(n) => (n, got),
                Dim::Succ(n) => match got.checked_sub(1) {
                    Some(v) => (n, v),
                    None => return Err(mismatch(self)),
                },
            };
            let known = self
                .dim(var)
                .or_else(|| fresh.iter().find(|(n, _)| *n == var).map(|(_, v)| *v));
            match known {
                Some(v) if v != value => return Err(mismatch(self)),
                Some(_) => {}
                None => fresh.push((var, value)),
            }
        }
        for (n, v) in fresh {
            self.bind(n, v, &format!("`{name}`"));
        }
        Ok(())
    }

    /// Fail on any tensor that was not taken, naming what `command` reads; tensors named in
    /// `ignored` are allowed and not read.
    pub fn finish(self, command: &str, accepted: &[&str], ignored: &[&str]) -> Result<()> {
        match self.tensors.keys().find(|n| !ignored.contains(&n.as_str())) {
            None => Ok(()),
            Some(name) => Err(CliError::UnexpectedTensor {
                name: name.clone(),
                command: command.to_string(),
                accepted: accepted.join(", "),
            }),
        }
    }
}

/// Values of one output tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// bfloat16.
    Bf16(Vec<bf16>),
    /// IEEE half.
    F16(Vec<f16>),
    /// f32.
    F32(Vec<f32>),
    /// f64 (the CPU reference's outputs).
    F64(Vec<f64>),
    /// i64 (indices, counts).
    I64(Vec<i64>),
    /// i32 (inputs such as `cu_seqlens` written by tests).
    I32(Vec<i32>),
}

impl Data {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Data::Bf16(v) => v.len(),
            Data::F16(v) => v.len(),
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::I32(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The safetensors dtype.
    pub fn dtype(&self) -> Dtype {
        match self {
            Data::Bf16(_) => Dtype::BF16,
            Data::F16(_) => Dtype::F16,
            Data::F32(_) => Dtype::F32,
            Data::F64(_) => Dtype::F64,
            Data::I64(_) => Dtype::I64,
            Data::I32(_) => Dtype::I32,
        }
    }

    /// Every value as f64 (exact for all but i64 beyond 2^53).
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            Data::Bf16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Data::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::F64(v) => v.clone(),
            Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I32(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }

    fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            Data::Bf16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

/// One output tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    /// Tensor name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Values (row-major).
    pub data: Data,
}

/// The outputs of a run, in the order they are documented.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outputs(pub Vec<Output>);

impl Outputs {
    /// Add a tensor; `shape` must describe `data` (the callers build both from one problem).
    pub fn push(&mut self, name: &str, shape: &[usize], data: Data) {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len(), "{name}");
        self.0.push(Output {
            name: name.to_string(),
            shape: shape.to_vec(),
            data,
        });
    }

    /// The tensor called `name`.
    pub fn get(&self, name: &str) -> Option<&Output> {
        self.0.iter().find(|o| o.name == name)
    }

    /// The safetensors file of these tensors, with `metadata` in its header.
    pub fn serialize(&self, metadata: HashMap<String, String>) -> Result<Vec<u8>> {
        let bytes: Vec<Vec<u8>> = self.0.iter().map(|o| o.data.to_le_bytes()).collect();
        let views = self
            .0
            .iter()
            .zip(&bytes)
            .map(|(o, b)| {
                safetensors::tensor::TensorView::new(o.data.dtype(), o.shape.clone(), b)
                    .map(|v| (o.name.clone(), v))
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| CliError::Internal(format!("building the output: {e}")))?;
        safetensors::serialize(views, &Some(metadata))
            .map_err(|e| CliError::Internal(format!("serializing the output: {e}")))
    }
}

/// Write `bytes` to `path` through a temporary file in the same directory, renamed over `path`
/// once complete; on any error the temporary file is removed and `path` is untouched.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let fail = |source| CliError::Write {
        path: path.to_path_buf(),
        source,
    };
    let name = path.file_name().ok_or_else(|| {
        fail(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the output path has no file name",
        ))
    })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)
    });
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e));
    }
    Ok(())
}
