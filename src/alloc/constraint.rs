//! `matchAttribute` and `distinctAttribute` constraints across the devices of a claim.

use std::fmt;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

use k8s_openapi::api::resource::v1::DeviceConstraint;

use super::plan::Slot;
use super::reason::{ConstraintKind, Holder, Rejection};

pub(crate) struct ConstraintSpec<'a> {
    pub(crate) claim: usize,
    pub(crate) index: usize,
    pub(crate) kind: ConstraintKind,
    pub(crate) attribute: &'a str,
    /// Request or sub-request names it applies to; empty means all of the claim.
    pub(crate) requests: Vec<&'a str>,
}

impl ConstraintSpec<'_> {
    pub(crate) fn applies_to(&self, slot: &Slot<'_>) -> bool {
        slot.claim == self.claim
            && (self.requests.is_empty()
                || self
                    .requests
                    .iter()
                    .any(|r| *r == slot.base || *r == slot.name))
    }
}

/// Checks a claim's constraints against the request names it has (`known`, including
/// `<request>/<subrequest>`). Errors are (field, value, problem).
pub(crate) fn parse<'a>(
    constraints: &'a [DeviceConstraint],
    claim: usize,
    known: &[String],
) -> Result<Vec<ConstraintSpec<'a>>, (String, String, String)> {
    let mut specs = Vec::with_capacity(constraints.len());
    for (index, constraint) in constraints.iter().enumerate() {
        let path = format!("spec.devices.constraints[{index}]");
        let (kind, field, attribute) =
            match (&constraint.match_attribute, &constraint.distinct_attribute) {
                (Some(a), None) => (ConstraintKind::MatchAttribute, "matchAttribute", a.as_str()),
                (None, Some(a)) => (
                    ConstraintKind::DistinctAttribute,
                    "distinctAttribute",
                    a.as_str(),
                ),
                _ => {
                    let problem = "set exactly one of matchAttribute or distinctAttribute";
                    return Err((path, String::new(), problem.into()));
                }
            };
        if !attribute.contains('/') {
            let problem =
                "must be fully qualified as <domain>/<name>, e.g. gpu.nvidia.com/parentUUID";
            return Err((
                format!("{path}.{field}"),
                attribute.to_string(),
                problem.into(),
            ));
        }
        let requests: Vec<&'a str> = constraint
            .requests
            .iter()
            .flatten()
            .map(String::as_str)
            .collect();
        for (ni, name) in requests.iter().enumerate() {
            if !known.iter().any(|k| k == name) {
                let problem = format!("no such request; valid: {}", known.join(", "));
                return Err((format!("{path}.requests[{ni}]"), name.to_string(), problem));
            }
        }
        specs.push(ConstraintSpec {
            claim,
            index,
            kind,
            attribute,
            requests,
        });
    }
    Ok(specs)
}

/// A typed attribute value; values of different types never compare equal.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum AttrValue<'a> {
    Bool(bool),
    Int(i64),
    Str(&'a str),
    Version(&'a str),
    Bools(&'a [bool]),
    Ints(&'a [i64]),
    Strs(&'a [String]),
    Versions(&'a [String]),
}

impl fmt::Display for AttrValue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttrValue::Bool(v) => write!(f, "{v}"),
            AttrValue::Int(v) => write!(f, "{v}"),
            AttrValue::Str(v) | AttrValue::Version(v) => f.write_str(v),
            AttrValue::Bools(v) => write!(f, "{v:?}"),
            AttrValue::Ints(v) => write!(f, "{v:?}"),
            AttrValue::Strs(v) | AttrValue::Versions(v) => write!(f, "{v:?}"),
        }
    }
}

fn typed(attribute: &DeviceAttribute) -> Option<AttrValue<'_>> {
    let a = attribute;
    a.string
        .as_deref()
        .map(AttrValue::Str)
        .or(a.int.map(AttrValue::Int))
        .or(a.bool.map(AttrValue::Bool))
        .or(a.version.as_deref().map(AttrValue::Version))
        .or(a.strings.as_deref().map(AttrValue::Strs))
        .or(a.ints.as_deref().map(AttrValue::Ints))
        .or(a.bools.as_deref().map(AttrValue::Bools))
        .or(a.versions.as_deref().map(AttrValue::Versions))
}

/// Looks up a fully qualified attribute. A device publishes its driver's own attributes
/// without the domain, so `gpu.nvidia.com/uuid` also finds `uuid` on a `gpu.nvidia.com`
/// device.
pub(crate) fn lookup<'a>(device: &'a Device, driver: &str, name: &str) -> Option<AttrValue<'a>> {
    let attributes = device.attributes.as_ref()?;
    if let Some(found) = attributes.get(name) {
        return typed(found);
    }
    let (domain, id) = name.split_once('/')?;
    if domain != driver {
        return None;
    }
    attributes.get(id).and_then(typed)
}

struct Chosen<'a> {
    value: AttrValue<'a>,
    device: &'a str,
    slot: usize,
}

/// The values chosen so far for each constraint of the claims being allocated.
pub(crate) struct Constraints<'a> {
    chosen: Vec<Vec<Chosen<'a>>>,
}

impl<'a> Constraints<'a> {
    pub(crate) fn new(count: usize) -> Self {
        Self {
            chosen: (0..count).map(|_| Vec::new()).collect(),
        }
    }

    /// Records `device` for `slot` in every constraint that applies, or explains which
    /// constraint rejects it (leaving nothing recorded).
    pub(crate) fn try_add(
        &mut self,
        specs: &[ConstraintSpec<'_>],
        slots: &[Slot<'_>],
        slot: usize,
        device: &'a Device,
        driver: &str,
    ) -> Result<(), Box<Rejection>> {
        let mut added = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            if !spec.applies_to(&slots[slot]) {
                continue;
            }
            let value = lookup(device, driver, spec.attribute);
            let conflict = match (&value, spec.kind) {
                (None, _) => Some(self.chosen[i].first()),
                (Some(v), ConstraintKind::MatchAttribute) => {
                    self.chosen[i].first().filter(|c| c.value != *v).map(Some)
                }
                (Some(v), ConstraintKind::DistinctAttribute) => {
                    self.chosen[i].iter().find(|c| c.value == *v).map(Some)
                }
            };
            if let Some(holder) = conflict {
                let rejection = Rejection::Constraint {
                    index: spec.index,
                    kind: spec.kind,
                    attribute: spec.attribute.to_string(),
                    value: value.as_ref().map(ToString::to_string),
                    chosen: holder.map(|h| Holder {
                        device: h.device.to_string(),
                        request: slots[h.slot].name.clone(),
                        value: h.value.to_string(),
                    }),
                };
                for j in added {
                    let list: &mut Vec<Chosen<'a>> = &mut self.chosen[j];
                    list.pop();
                }
                return Err(Box::new(rejection));
            }
            if let Some(value) = value {
                self.chosen[i].push(Chosen {
                    value,
                    device: &device.name,
                    slot,
                });
                added.push(i);
            }
        }
        Ok(())
    }

    /// Undoes the latest successful [`Constraints::try_add`] for `slot`.
    pub(crate) fn remove(&mut self, specs: &[ConstraintSpec<'_>], slots: &[Slot<'_>], slot: usize) {
        for (i, spec) in specs.iter().enumerate() {
            if spec.applies_to(&slots[slot]) {
                self.chosen[i].pop();
            }
        }
    }
}
