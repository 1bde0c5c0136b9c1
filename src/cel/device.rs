//! What a selector sees of one device: the `device` variable of Kubernetes' DRA CEL
//! environment, built once from the API object and reused for every evaluation.
//!
//! `device.driver` is the driver name; `device.attributes[domain][id]` and
//! `device.capacity[domain][id]` hold the attributes (int, bool, string, semver, or lists of
//! those) and capacities (quantities), where a name without a domain (`profile`) belongs to
//! the driver's domain and `resource.kubernetes.io/pciBusID` to `resource.kubernetes.io`;
//! `device.allowMultipleAllocations` is a bool. Looking up a domain the device does not have
//! yields an empty map (so `'x' in device.attributes['other.io']` is false) while a missing
//! name inside a domain is an error (`no such key: <id>`), as in Kubernetes.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};

use cel::ExecutionError;
use cel::common::traits::Indexer;
use cel::common::types::{CelBool, CelInt, CelList, CelMapKey, CelString, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

use super::CelError;
use super::domain_map::{DomainMap, string_key};
use super::quantity_lib::QuantityVal;
use super::semver_lib::{SemverVal, parse_strict};
use crate::quantity::Quantity;

static DEVICE_TYPE: Type = Type::new_unspecified_type("kubernetes.DRADevice");

/// One device as CEL sees it. Built once with [`DeviceView::from_api`], then shared by any
/// number of evaluations (it is `Send + Sync`).
#[derive(Clone, Debug)]
pub struct DeviceView {
    name: String,
    root: DeviceVal,
}

impl DeviceView {
    /// Builds the view of `device` as published by `driver`.
    ///
    /// # Errors
    /// [`CelError::Attribute`] when an attribute has no value or several, or two names
    /// qualify to the same one; [`CelError::Version`] when a version is not a semantic
    /// version; [`CelError::Capacity`] when a capacity is not a valid quantity.
    pub fn from_api(driver: &str, device: &Device) -> Result<Self, CelError> {
        let name = device.name.clone();
        let mut attributes: BTreeMap<String, HashMap<CelMapKey<'static>, Box<dyn Val>>> =
            BTreeMap::new();
        for (qualified, attribute) in device.attributes.iter().flatten() {
            let value = attribute_value(&name, qualified, attribute)?;
            insert(&mut attributes, driver, &name, qualified, value)?;
        }
        let mut capacity: BTreeMap<String, HashMap<CelMapKey<'static>, Box<dyn Val>>> =
            BTreeMap::new();
        for (qualified, value) in device.capacity.iter().flatten() {
            let quantity =
                Quantity::from_k8s(&value.value).map_err(|source| CelError::Capacity {
                    device: name.clone(),
                    capacity: qualified.clone(),
                    source,
                })?;
            insert(
                &mut capacity,
                driver,
                &name,
                qualified,
                Box::new(QuantityVal(quantity)),
            )?;
        }
        Ok(DeviceView {
            name,
            root: DeviceVal {
                driver: CelString::from(driver.to_owned()),
                attributes: DomainMap::new(attributes),
                capacity: DomainMap::new(capacity),
                allow_multiple_allocations: CelBool::from(
                    device.allow_multiple_allocations.unwrap_or(false),
                ),
            },
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The driver the device belongs to, the domain of its unqualified names.
    pub fn driver(&self) -> &str {
        self.root.driver.inner()
    }

    pub(super) fn value(&self) -> &DeviceVal {
        &self.root
    }
}

/// Splits `domain/id`; a name without a domain belongs to the driver's.
fn split_name<'a>(qualified: &'a str, driver: &'a str) -> (&'a str, &'a str) {
    qualified.split_once('/').unwrap_or((driver, qualified))
}

fn insert(
    domains: &mut BTreeMap<String, HashMap<CelMapKey<'static>, Box<dyn Val>>>,
    driver: &str,
    device: &str,
    qualified: &str,
    value: Box<dyn Val>,
) -> Result<(), CelError> {
    let (domain, id) = split_name(qualified, driver);
    let previous = domains
        .entry(domain.to_owned())
        .or_default()
        .insert(CelMapKey::from(id.to_owned()), value);
    if previous.is_some() {
        return Err(CelError::Attribute {
            device: device.to_owned(),
            attribute: qualified.to_owned(),
            reason: format!("{domain}/{id} is given twice (once with and once without its domain)"),
        });
    }
    Ok(())
}

fn attribute_value(
    device: &str,
    name: &str,
    attribute: &DeviceAttribute,
) -> Result<Box<dyn Val>, CelError> {
    let version = |value: &str| {
        parse_strict(value)
            .map(SemverVal)
            .map_err(|source| CelError::Version {
                device: device.to_owned(),
                attribute: name.to_owned(),
                value: value.to_owned(),
                source,
            })
    };
    let list = |items: Vec<Box<dyn Val>>| -> Box<dyn Val> { Box::new(CelList::from(items)) };
    let mut values: Vec<(&str, Box<dyn Val>)> = Vec::new();
    if let Some(v) = attribute.bool {
        values.push(("bool", Box::new(CelBool::from(v))));
    }
    if let Some(v) = attribute.int {
        values.push(("int", Box::new(CelInt::from(v))));
    }
    if let Some(v) = &attribute.string {
        values.push(("string", Box::new(CelString::from(v.clone()))));
    }
    if let Some(v) = &attribute.version {
        values.push(("version", Box::new(version(v)?)));
    }
    if let Some(vs) = &attribute.bools {
        values.push((
            "bools",
            list(
                vs.iter()
                    .map(|v| Box::new(CelBool::from(*v)) as Box<dyn Val>)
                    .collect(),
            ),
        ));
    }
    if let Some(vs) = &attribute.ints {
        values.push((
            "ints",
            list(
                vs.iter()
                    .map(|v| Box::new(CelInt::from(*v)) as Box<dyn Val>)
                    .collect(),
            ),
        ));
    }
    if let Some(vs) = &attribute.strings {
        values.push((
            "strings",
            list(
                vs.iter()
                    .map(|v| Box::new(CelString::from(v.clone())) as Box<dyn Val>)
                    .collect(),
            ),
        ));
    }
    if let Some(vs) = &attribute.versions {
        let items = vs
            .iter()
            .map(|v| version(v).map(|s| Box::new(s) as Box<dyn Val>))
            .collect::<Result<Vec<_>, _>>()?;
        values.push(("versions", list(items)));
    }
    let kinds: Vec<&str> = values.iter().map(|(kind, _)| *kind).collect();
    match values.pop() {
        Some((_, value)) if values.is_empty() => Ok(value),
        _ => Err(CelError::Attribute {
            device: device.to_owned(),
            attribute: name.to_owned(),
            reason: format!(
                "exactly one of bool, int, string, version, bools, ints, strings or versions must be set, found {}",
                if kinds.is_empty() {
                    "none".to_owned()
                } else {
                    kinds.join(", ")
                }
            ),
        }),
    }
}

/// The `device` variable.
#[derive(Clone, Debug)]
pub(super) struct DeviceVal {
    driver: CelString<'static>,
    attributes: DomainMap,
    capacity: DomainMap,
    allow_multiple_allocations: CelBool,
}

impl Val for DeviceVal {
    fn get_type(&self) -> &Type {
        &DEVICE_TYPE
    }

    fn cel_type() -> &'static Type {
        &DEVICE_TYPE
    }

    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<DeviceVal>().is_some_and(|other| {
            self.driver.equals(&other.driver)
                && self.attributes.equals(&other.attributes)
                && self.capacity.equals(&other.capacity)
                && self
                    .allow_multiple_allocations
                    .equals(&other.allow_multiple_allocations)
        })
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for DeviceVal {}

impl Indexer for DeviceVal {
    fn get<'b, 'v>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        let field = string_key(idx)?;
        let value: &dyn Val = match field {
            "driver" => &self.driver,
            "attributes" => &self.attributes,
            "capacity" => &self.capacity,
            "allowMultipleAllocations" => &self.allow_multiple_allocations,
            _ => return Err(ExecutionError::no_such_key(field)),
        };
        Ok(CowVal::Borrowed(value))
    }

    fn steal<'v>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}
