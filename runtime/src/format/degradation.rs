//! What failed in the mesh, as a layout spec, the command line or the artifact's metadata
//! name it (docs/design.md §6.2). What the runtime does about it is `crate::comm::degraded`.

use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};

use crate::format::mesh::Mesh;

/// What failed: devices, links (pairs of neighbouring devices), and devices degraded along
/// one dimension only (device, dimension). Devices are numbered as in `Mesh::device`.
/// Recorded in the artifact's metadata when the layout spec names a degradation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Degradation {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<(usize, usize)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub along: Vec<(usize, usize)>,
}

impl Degradation {
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.links.is_empty() && self.along.is_empty()
    }

    /// Both degradations at once (what is named twice counts once).
    pub fn merged(&self, other: &Degradation) -> Degradation {
        let mut out = self.clone();
        out.nodes.extend(other.nodes.iter().filter(|d| !self.nodes.contains(d)));
        out.links.extend(other.links.iter().filter(|l| !self.links.contains(l)));
        out.along.extend(other.along.iter().filter(|l| !self.along.contains(l)));
        out
    }

    /// From the command line: devices as coordinates (`1,2`) and links as two of them (`0,0:0,1`).
    pub fn from_args(mesh: &Mesh, devices: &[String], links: &[String]) -> Result<Degradation> {
        let device = |s: &str| -> Result<usize> {
            let c: Vec<usize> = s
                .split(',')
                .map(|x| x.trim().parse::<usize>())
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| anyhow!("device '{s}': expected coordinates such as 1,2"))?;
            if c.len() != mesh.shape.len() || c.iter().zip(&mesh.shape).any(|(&x, &n)| x >= n) {
                bail!("device '{s}' is not in the {:?} mesh", mesh.shape);
            }
            Ok(mesh.device(&c))
        };
        let nodes = devices.iter().map(|s| device(s)).collect::<Result<_>>()?;
        let links = links
            .iter()
            .map(|s| match s.split_once(':') {
                Some((a, b)) => Ok((device(a)?, device(b)?)),
                None => bail!("link '{s}': expected two devices such as 0,0:0,1"),
            })
            .collect::<Result<_>>()?;
        Ok(Degradation { nodes, links, along: Vec::new() })
    }
}
