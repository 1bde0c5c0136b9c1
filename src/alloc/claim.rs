//! Checks claims and turns their requests into the plan the search works from: one slot
//! per request or `firstAvailable` sub-request, with compiled selectors.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::resource::v1::{
    CapacityRequirements, DeviceClass, DeviceSelector, DeviceToleration, ResourceClaim,
};

use super::constraint::ConstraintSpec;
use super::engine::{ProgramCache, SelectorEngine};
use super::plan::{CapacityRequest, ClaimPlan, RequestPlan, Selector, Slot};
use super::reason::Wants;
use super::state::claim_display;
use super::{AllocError, MAX_DEVICES_PER_CLAIM};
use crate::quantity::Quantity;

/// A set of claims checked and compiled, ready to be allocated on any number of nodes.
///
/// All claims are allocated together on one node, as the scheduler does for the claims of
/// one Pod.
pub struct Prepared<'a, E: SelectorEngine> {
    pub(crate) claims: Vec<ClaimPlan<'a>>,
    pub(crate) slots: Vec<Slot<'a>>,
    pub(crate) requests: Vec<RequestPlan>,
    pub(crate) constraints: Vec<ConstraintSpec<'a>>,
    pub(crate) programs: Vec<E::Program>,
}

/// The fields an `exactly` request and a `firstAvailable` sub-request share.
struct Fields<'a> {
    path: String,
    class_name: &'a str,
    selectors: &'a [DeviceSelector],
    mode: Option<&'a str>,
    count: Option<i64>,
    admin: bool,
    tolerations: &'a [DeviceToleration],
    capacity: Option<&'a CapacityRequirements>,
}

pub(crate) struct Builder<'a, 'e, E: SelectorEngine> {
    engine: &'e E,
    classes: &'e BTreeMap<&'a str, &'a DeviceClass>,
    cache: ProgramCache<'a, E::Program>,
    prepared: Prepared<'a, E>,
}

impl<'a, 'e, E: SelectorEngine> Builder<'a, 'e, E> {
    pub(crate) fn new(engine: &'e E, classes: &'e BTreeMap<&'a str, &'a DeviceClass>) -> Self {
        Self {
            engine,
            classes,
            cache: ProgramCache::new(),
            prepared: Prepared {
                claims: Vec::new(),
                slots: Vec::new(),
                requests: Vec::new(),
                constraints: Vec::new(),
                programs: Vec::new(),
            },
        }
    }

    pub(crate) fn finish(mut self) -> Prepared<'a, E> {
        self.prepared.programs = self.cache.programs;
        self.prepared
    }

    pub(crate) fn add_claim(&mut self, claim: &'a ResourceClaim) -> Result<(), AllocError> {
        let claim_index = self.prepared.claims.len();
        let display = claim_display(claim);
        let invalid = |field: String, value: String, problem: String| AllocError::InvalidClaim {
            claim: display.clone(),
            field,
            value,
            problem,
        };
        let devices = claim.spec.as_ref().and_then(|s| s.devices.as_ref());
        let requests = devices
            .and_then(|d| d.requests.as_deref())
            .unwrap_or_default();
        let mut plan = ClaimPlan {
            claim,
            display: display.clone(),
            requests: Vec::new(),
        };
        let mut known: Vec<String> = Vec::new();
        for (ri, request) in requests.iter().enumerate() {
            let path = format!("spec.devices.requests[{ri}]");
            if known.contains(&request.name) {
                return Err(invalid(
                    format!("{path}.name"),
                    request.name.clone(),
                    "request names must be unique within a claim".into(),
                ));
            }
            known.push(request.name.clone());
            let alternatives = request.first_available.as_deref().unwrap_or_default();
            let fields: Vec<(Option<&'a str>, Fields<'a>)> = match (&request.exactly, alternatives)
            {
                (Some(_), [_, ..]) => {
                    return Err(invalid(
                        path,
                        request.name.clone(),
                        "set either exactly or firstAvailable, not both".into(),
                    ));
                }
                (Some(exact), []) => vec![(
                    None,
                    Fields {
                        path: format!("{path}.exactly"),
                        class_name: &exact.device_class_name,
                        selectors: exact.selectors.as_deref().unwrap_or_default(),
                        mode: exact.allocation_mode.as_deref(),
                        count: exact.count,
                        admin: exact.admin_access == Some(true),
                        tolerations: exact.tolerations.as_deref().unwrap_or_default(),
                        capacity: exact.capacity.as_ref(),
                    },
                )],
                (None, []) => {
                    return Err(invalid(
                        path,
                        request.name.clone(),
                        "a request needs exactly or firstAvailable".into(),
                    ));
                }
                (None, subs) => {
                    let mut seen = HashSet::new();
                    let mut out = Vec::new();
                    for (si, sub) in subs.iter().enumerate() {
                        let sub_path = format!("{path}.firstAvailable[{si}]");
                        if !seen.insert(sub.name.as_str()) {
                            return Err(invalid(
                                format!("{sub_path}.name"),
                                sub.name.clone(),
                                "sub-request names must be unique within a request".into(),
                            ));
                        }
                        known.push(format!("{}/{}", request.name, sub.name));
                        out.push((
                            Some(sub.name.as_str()),
                            Fields {
                                path: sub_path,
                                class_name: &sub.device_class_name,
                                selectors: sub.selectors.as_deref().unwrap_or_default(),
                                mode: sub.allocation_mode.as_deref(),
                                count: sub.count,
                                admin: false,
                                tolerations: sub.tolerations.as_deref().unwrap_or_default(),
                                capacity: sub.capacity.as_ref(),
                            },
                        ));
                    }
                    out
                }
            };
            let request_index = self.prepared.requests.len();
            let mut slots = Vec::new();
            for (sub, fields) in fields {
                let name = match sub {
                    Some(sub) => format!("{}/{sub}", request.name),
                    None => request.name.clone(),
                };
                let slot = self.slot(claim_index, &display, &request.name, name, fields)?;
                self.prepared.slots.push(slot);
                slots.push(self.prepared.slots.len() - 1);
            }
            self.prepared.requests.push(RequestPlan {
                claim: claim_index,
                alternatives: slots,
            });
            plan.requests.push(request_index);
        }
        let constraints = devices
            .and_then(|d| d.constraints.as_deref())
            .unwrap_or_default();
        let specs = super::constraint::parse(constraints, claim_index, &known)
            .map_err(|(field, value, problem)| invalid(field, value, problem))?;
        self.prepared.constraints.extend(specs);
        self.prepared.claims.push(plan);
        Ok(())
    }

    fn slot(
        &mut self,
        claim: usize,
        display: &str,
        base: &'a str,
        name: String,
        fields: Fields<'a>,
    ) -> Result<Slot<'a>, AllocError> {
        let invalid = |field: String, value: String, problem: String| AllocError::InvalidClaim {
            claim: display.to_string(),
            field,
            value,
            problem,
        };
        let path = &fields.path;
        let Some((class_name, class)) = self.classes.get_key_value(fields.class_name) else {
            return Err(AllocError::UnknownClass {
                claim: display.to_string(),
                field: format!("{path}.deviceClassName"),
                value: fields.class_name.to_string(),
                known: self.classes.keys().copied().collect::<Vec<_>>().join(", "),
            });
        };
        let wants = match fields.mode.unwrap_or("ExactCount") {
            "ExactCount" => {
                let count = fields.count.unwrap_or(1);
                if count < 1 {
                    return Err(invalid(
                        format!("{path}.count"),
                        count.to_string(),
                        "must be at least 1".into(),
                    ));
                }
                if count as u64 > MAX_DEVICES_PER_CLAIM as u64 {
                    return Err(invalid(
                        format!("{path}.count"),
                        count.to_string(),
                        format!("a claim holds at most {MAX_DEVICES_PER_CLAIM} devices"),
                    ));
                }
                Wants::ExactCount(count as usize)
            }
            "All" => Wants::All,
            other => {
                return Err(invalid(
                    format!("{path}.allocationMode"),
                    other.to_string(),
                    "valid: ExactCount, All".into(),
                ));
            }
        };
        let class_selectors = self.compile_all(
            class
                .spec
                .as_ref()
                .and_then(|s| s.selectors.as_deref())
                .unwrap_or_default(),
            &format!("deviceclass {class_name}"),
            "spec.selectors",
        )?;
        let owner = format!("claim {display}");
        let selectors = self.compile_all(fields.selectors, &owner, &format!("{path}.selectors"))?;
        let mut capacity = Vec::new();
        for (cap, quantity) in fields
            .capacity
            .and_then(|c| c.requests.as_ref())
            .into_iter()
            .flatten()
        {
            let amount = Quantity::from_k8s(quantity).map_err(|err| {
                invalid(
                    format!("{path}.capacity.requests.{cap}"),
                    quantity.0.clone(),
                    format!("not a quantity: {}", err.problem()),
                )
            })?;
            capacity.push(CapacityRequest { name: cap, amount });
        }
        Ok(Slot {
            claim,
            name,
            base,
            class,
            class_name,
            class_selectors,
            selectors,
            wants,
            admin: fields.admin,
            tolerations: fields.tolerations,
            capacity,
        })
    }

    fn compile_all(
        &mut self,
        selectors: &'a [DeviceSelector],
        owner: &str,
        path: &str,
    ) -> Result<Vec<Selector<'a>>, AllocError> {
        let mut out = Vec::with_capacity(selectors.len());
        for (index, selector) in selectors.iter().enumerate() {
            let Some(cel) = selector.cel.as_ref() else {
                return Err(AllocError::SelectorCompile {
                    owner: owner.to_string(),
                    field: format!("{path}[{index}]"),
                    expression: String::new(),
                    message: "selector has no cel expression (the only supported kind)".into(),
                });
            };
            let engine = self.engine;
            let program = self
                .cache
                .get_or_compile(&cel.expression, |e| engine.compile(e))
                .map_err(|message| AllocError::SelectorCompile {
                    owner: owner.to_string(),
                    field: format!("{path}[{index}].cel.expression"),
                    expression: cel.expression.clone(),
                    message,
                })?;
            out.push(Selector {
                program,
                expression: &cel.expression,
                index,
            });
        }
        Ok(out)
    }
}
