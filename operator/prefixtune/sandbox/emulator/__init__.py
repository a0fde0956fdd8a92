"""A Kubernetes API server emulator that behaves like kube-apiserver where operators depend on it.

``RealisticEmulator`` extends kmock 0.8's ``KubernetesEmulator`` (an in-memory object store over HTTP)
with the server-side behaviour that kopf, the official ``kubernetes`` client and kubectl rely on:

* Server metadata on create: ``uid``, ``creationTimestamp``, ``generation`` 1, a ``resourceVersion``
  from one global counter, ``metadata.namespace`` from the URL, names from ``generateName``; names
  are validated (DNS-1123 subdomains); 404 for undeclared resources; ``status`` is dropped on create
  when the resource has a status subresource, and a built-in kind gets the status its registry
  strategy sets (``strategies.py``: ``{}`` for a Deployment, ``Pending`` and the QoS class for a Pod).
* Writes: every write bumps the resourceVersion (a no-op write changes nothing, as on the real
  server); a stale ``metadata.resourceVersion`` in a merge patch, strategic merge patch or PUT body
  gives 409 Conflict; a failed JSON-patch ``test`` gives 422 Invalid; ``generation`` increments only
  when something outside ``metadata`` and ``status`` changes; the status subresource is isolated from
  the main resource in both directions; finalizers delay deletion (``deletionTimestamp``), and no new
  finalizer can be added to a terminating object. A deleted pod is first marked terminating
  (``deletionTimestamp`` and its grace period, a MODIFIED event), then deleted: graceful termination
  compressed, which watchers that act on the mark alone (the routers' pod discovery) need.
* PATCH flavours (see ``_patches``): merge patch, strategic merge patch (named lists merged by key;
  415 for custom resources, as on the real server), JSON patch; PUT replace; ``dryRun=All``.
* Lists and watches: label and field selectors, ``kind``/``apiVersion`` and the real resourceVersion
  on lists; watches honour ``timeoutSeconds``, ``resourceVersion`` (events after it are replayed from
  a bounded log, nothing older; too old gives an ERROR 410 Expired event), ``sendInitialEvents`` (ends
  with the ``k8s.io/initial-events-end`` BOOKMARK), send ``Content-Type: application/json``, subscribe
  atomically with their snapshot, and turn selector transitions into ADDED/DELETED as the server does.
* CRDs: creating or replacing a CustomResourceDefinition validates its names, registers its served
  versions in discovery (kind, plural, singular, shortNames, categories, scope, status/scale
  subresources) and sets the ``NamesAccepted`` and ``Established`` conditions; deleting it removes the
  resource from discovery and deletes its objects.
* The scale subresource of a custom resource whose CRD declares it (``scale.py``): GET, PUT and
  PATCH of ``.../NAME/scale`` as an ``autoscaling/v1`` Scale read from and written to the CRD's
  replicas and selector paths, as apiextensions-apiserver's ``ScaleREST`` does (a write is an update
  of the resource: generation, watch event, the Scale's resourceVersion as precondition).
* Discovery fixes: ``/api/v1`` says groupVersion ``v1``, ``/version/`` is served, subresources are
  listed like the real server does, the preferred version of a group is its highest-priority version.
* Errors are canonical ``Status`` objects: reasons NotFound, AlreadyExists, Conflict, Invalid,
  BadRequest, MethodNotAllowed, UnsupportedMediaType, Expired, InternalError, with code and details.
* Garbage collection: when an owner is really deleted, its dependents (``ownerReferences[].uid``) are
  deleted in the background, transitively; dependents that still have a live owner only lose the
  dangling reference; ``propagationPolicy: Orphan`` strips the references instead.
* Tables for ``kubectl get`` (``tables.py``, ``printers.py``): an ``Accept`` of
  ``application/json;as=Table;g=meta.k8s.io`` answers a ``meta.k8s.io`` Table of the CRD's
  ``additionalPrinterColumns`` (JSONPath) or of the built-in printers of pods, deployments,
  replicasets, namespaces and services (NAME AGE otherwise), with ``includeObject``.
* ``pods/log`` (``logs.py``): plain text from ``pod_logs`` (the sandbox kubelet's ``ContainerLogs``),
  with the server's container choice and errors, ``previous``, ``tailLines``, ``limitBytes`` and
  ``timestamps`` (not ``follow``).
* OpenAPI v3 (``openapi.py``): ``/openapi/v3`` and one document per group version, the CRDs'
  schemas under their GVKs, every PATCH declaring ``fieldValidation`` (so ``kubectl apply`` validates
  on the server without ``--validate=false``, and ``kubectl explain`` works); with
  ``fieldValidation=Strict`` a custom resource's fields its schema does not declare are a 400.
* Namespaces are objects (``default``, ``kube-system`` and ``kube-public`` exist from the start)
  and are required as the NamespaceLifecycle admission plugin requires them: a create or update in
  a missing namespace is 404 ``namespaces "x" not found``, a create in a terminating one 403.
* Events (core v1 and events.k8s.io) are ordinary objects, so kopf's ``generateName`` events are stored.
* Fault injection (``faults=ApiFaults(...)``, off by default; ``faults.py``): 500/503 answers, 409 on
  status patches and dropped watches for the clients under test (by bearer token), and an audit of
  their requests.

What it does NOT emulate:

* Admission (webhooks, LimitRanges, quotas), authentication and RBAC (every request is allowed).
* Schema validation (types, enums, CEL rules), pruning and defaulting by the server, except the name
  checks above and ``fieldValidation=Strict``'s unknown fields of custom resources; OpenAPI v2;
  schemas of built-in kinds; field selectors accept any dotted path.
* Server-side apply (415), ``kubectl diff``, Tables in watch streams (``kubectl get -w``), the scale
  subresource of built-in resources (a Deployment's), protobuf bodies (415), pagination (``limit``
  is ignored and everything is returned), periodic watch bookmarks.
* Controllers: Deployments never get ReplicaSets, Pods or a filled status; whatever plays the kubelet must
  patch ``/status`` itself. Deleting a namespace cascades nothing (its objects stay, and can only
  be deleted).
* Foreground deletion is treated as background; garbage collection timing is immediate, not real.

It relies on kmock **private internals** (``_objects``, ``_lock``, ``_buses``, ``_serve_*``,
``kmock._internal`` modules): the dependency is pinned to ``kmock==0.8`` and the layer is covered by
its own tests, including characterisation tests of the stock emulator.

The package, one module per seam: ``store`` (``RealisticEmulator``: dispatching, writes, reads),
``watch`` (the event log and the watch streams), ``crds``, ``scale`` (the scale subresource),
``gc`` (garbage collection), ``discovery``, ``tables`` (Table responses; ``printers`` and
``jsonpath`` fill them), ``strategies`` (the status set on create), ``logs`` (``pods/log``),
``openapi``, ``errors`` (``Status`` objects), ``core`` (the state and lookups they share) and
``serving`` (HTTP and kubeconfigs).
"""

from prefixtune.sandbox.emulator.crds import CRD_RESOURCE
from prefixtune.sandbox.emulator.errors import ApiError, api_error
from prefixtune.sandbox.emulator.serving import kubeconfig, serve_emulator, write_kubeconfig
from prefixtune.sandbox.emulator.store import RealisticEmulator

__all__ = [
    "CRD_RESOURCE",
    "ApiError",
    "RealisticEmulator",
    "api_error",
    "kubeconfig",
    "serve_emulator",
    "write_kubeconfig",
]
