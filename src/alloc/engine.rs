//! The seam between the allocator and whatever evaluates device selectors.
//!
//! The allocator never parses selector expressions itself: the CEL module (or a test table)
//! plugs in through [`SelectorEngine`]. Each distinct expression is compiled once per
//! [`Prepared`](super::Prepared) claim set and each device's view is built once per
//! [`Allocator`](super::Allocator), however many nodes, requests and search steps look at it.

use std::cell::Cell;
use std::collections::HashMap;

use k8s_openapi::api::resource::v1::Device;

/// Compiles and evaluates the selector expressions of DeviceClasses and requests.
///
/// Errors are plain messages: the allocator attaches the expression, the class or request
/// and the device before anyone sees them. The allocator is single-threaded, so neither
/// programs nor views need to be `Send` or `Sync`.
pub trait SelectorEngine {
    /// A compiled selector, reused for every device it is evaluated against.
    type Program;
    /// What a selector sees of one device. It may borrow the device (lifetime `'d`), so an
    /// engine that needs no conversion pays nothing to build it.
    type View<'d>;

    /// Builds the view of `device` as published by `driver`. Called at most once per device
    /// per allocator; an error is reported against every selector evaluated on the device.
    fn view<'d>(&self, driver: &'d str, device: &'d Device) -> Result<Self::View<'d>, String>;

    /// Compiles one expression. An error makes the claim (or class) unusable: it is bad input.
    fn compile(&self, expression: &str) -> Result<Self::Program, String>;

    /// Evaluates a compiled selector against one device view. `Ok(false)` means the device
    /// does not match; an error aborts allocation on the node, as in Kubernetes.
    fn evaluate(&self, program: &Self::Program, view: &Self::View<'_>) -> Result<bool, String>;
}

/// Another engine, counting the selector evaluations the allocator asks of it: the length of
/// the first-fit walk in the unit kube-scheduler pays for (it evaluates a device's class
/// selectors, then the request's, stopping at the first that fails), independent of how fast
/// this machine is. Benches report it per node evaluation and tests guard it.
#[derive(Debug, Default)]
pub struct Counting<E> {
    inner: E,
    evaluations: Cell<u64>,
}

impl<E> Counting<E> {
    /// Wraps `inner`, starting the count at zero.
    pub fn new(inner: E) -> Self {
        Self {
            inner,
            evaluations: Cell::new(0),
        }
    }

    /// Returns the selector evaluations so far (errors included) and starts again from zero.
    pub fn take(&self) -> u64 {
        self.evaluations.replace(0)
    }
}

impl<E: SelectorEngine> SelectorEngine for Counting<E> {
    type Program = E::Program;
    type View<'d> = E::View<'d>;

    fn view<'d>(&self, driver: &'d str, device: &'d Device) -> Result<Self::View<'d>, String> {
        self.inner.view(driver, device)
    }

    fn compile(&self, expression: &str) -> Result<Self::Program, String> {
        self.inner.compile(expression)
    }

    fn evaluate(&self, program: &Self::Program, view: &Self::View<'_>) -> Result<bool, String> {
        self.evaluations.set(self.evaluations.get() + 1);
        self.inner.evaluate(program, view)
    }
}

/// Compiles each distinct expression once and hands out stable indices into `programs`.
pub(crate) struct ProgramCache<'a, P> {
    index: HashMap<&'a str, usize>,
    pub(crate) programs: Vec<P>,
}

impl<'a, P> ProgramCache<'a, P> {
    pub(crate) fn new() -> Self {
        Self {
            index: HashMap::new(),
            programs: Vec::new(),
        }
    }

    /// Returns the index of the compiled `expression`, compiling it on first sight.
    pub(crate) fn get_or_compile(
        &mut self,
        expression: &'a str,
        compile: impl FnOnce(&str) -> Result<P, String>,
    ) -> Result<usize, String> {
        if let Some(found) = self.index.get(expression) {
            return Ok(*found);
        }
        let program = compile(expression)?;
        self.programs.push(program);
        let id = self.programs.len() - 1;
        self.index.insert(expression, id);
        Ok(id)
    }
}
