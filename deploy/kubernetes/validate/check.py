#!/usr/bin/env python3
"""Checks deploy/kubernetes; validate.sh runs it in target/k8s-venv.

    check.py RENDER_BASE RENDER_ALL THIRD_PARTY_OUT

RENDER_BASE and RENDER_ALL are `kubectl kustomize` of the base and of the
base with every component. Checks:
  files        every file under deploy/kubernetes is covered by some check;
               every path a kustomization names exists
  k8s          built-in objects against Kubernetes' schemas (kubernetes-validate,
               strict: unknown fields are errors), for each of K8S_VERSIONS
  crd          the TokenBucketAdmission CRD is a structural schema; every
               TokenBucketAdmission against it (unknown fields are errors, as
               with kubectl's strict field validation; its CEL rules);
               broken ones rejected; the acme-corp example equals
               config/acme-corp.toml's tenant
  kueue        components/kueue's ResourceFlavor, ClusterQueue and LocalQueue
               against Kueue's CRDs (validate/kueue/, v1beta2: schema with
               defaults, unknown fields refused, CEL rules), broken ones
               rejected; the queued model server's LocalQueue, ClusterQueue,
               quota and flavor admit it, and Fairway's placement still sees
               it; it is the example model server plus the queue label
  scheduler    the KubeSchedulerConfiguration's fields, by the kube-scheduler
               v1 Go types' names
  consistency  the policy, the manifests and the examples name the same
               ports, paths, Services, Secrets keys, models and backends;
               every Fairway container is non-root, read-only, unprivileged
  store        each render's store is the one its policy names: the base's
               one Valkey behind the Service in `redis://` (port, password,
               budget, readiness); components/store-sentinel's pods behind
               `redis+sentinel://` (every pod's sentinel by the headless
               Service's names and port, the monitored name, a majority
               quorum, store.sh starting both containers, the password,
               one pod per node, a budget keeping a majority), broken ones
               refused; the component's fairway.toml is config/fairway.toml
               but for the store line
Third-party custom resources (cert-manager, Prometheus Operator, KEDA) are
written to THIRD_PARTY_OUT for crs.mjs; Kueue's are checked here, against
the CRDs vendored in validate/kueue/ (no @kubernetes-models package has them).
"""

import copy
import hashlib
import json
import re
import subprocess
import sys
import tomllib
from fractions import Fraction
from pathlib import Path

import celpy
import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate import utils as kv_utils

K8S_VERSIONS = ["1.30", "1.37"]
THIRD_PARTY_GROUPS = {"cert-manager.io", "monitoring.coreos.com", "keda.sh"}

HERE = Path(__file__).resolve().parent
KDIR = HERE.parent                       # deploy/kubernetes
REPO = KDIR.parent.parent

# The schema files are read once, not once per object.
_schema_contents = kv_utils.schema_contents
_cache = {}


def _cached_schema_contents(filename, desired_version):
    if filename not in _cache:
        _cache[filename] = _schema_contents(filename, desired_version)
    return _cache[filename]


kv_utils.schema_contents = _cached_schema_contents


class Report:
    def __init__(self):
        self.passed = 0
        self.failures = []

    def ok(self, what):
        self.passed += 1
        print(f"  ok    {what}")

    def fail(self, what, why):
        self.failures.append(f"{what}: {why}")
        print(f"  FAIL  {what}: {why}")

    def check(self, cond, what, why):
        if cond:
            self.ok(what)
        else:
            self.fail(what, why)
        return cond


R = Report()


def rel(p):
    return str(Path(p).resolve().relative_to(REPO))


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def kind_key(doc):
    return (doc.get("apiVersion", ""), doc.get("kind", ""))


def group_of(doc):
    api = doc.get("apiVersion", "")
    return api.split("/")[0] if "/" in api else ""


def name_of(doc):
    meta = doc.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{doc.get('kind')}/{(ns + '/') if ns else ''}{meta.get('name')}"


# ---------------------------------------------------------------- files

def kustomization_paths(kfile):
    """Every file a kustomization names, and the components it includes."""
    k = yaml.safe_load(open(kfile))
    base = kfile.parent
    files, dirs = [], []
    for r in k.get("resources", []) + k.get("components", []):
        p = base / r
        (dirs if p.is_dir() else files).append(p)
    for gen in k.get("configMapGenerator", []) + k.get("secretGenerator", []):
        for f in gen.get("files", []):
            files.append(base / f.split("=", 1)[-1])
    for patch in k.get("patches", []):
        if "path" in patch:
            files.append(base / patch["path"])
    return files, dirs


def check_files():
    print("files")
    covered = set()
    kfiles = [KDIR / "kustomization.yaml"] + sorted(KDIR.glob("components/*/kustomization.yaml"))
    for kfile in kfiles:
        covered.add(kfile)
        files, dirs = kustomization_paths(kfile)
        missing = [rel(p) for p in files + dirs if not p.exists()]
        R.check(not missing, f"{rel(kfile)}: every path it names exists", f"missing: {missing}")
        covered.update(p.resolve() for p in files)
        for d in dirs:
            if (d / "kustomization.yaml").exists():
                covered.add((d / "kustomization.yaml").resolve())
    covered.update(p.resolve() for p in KDIR.glob("examples/*.yaml"))     # validated one by one
    covered.add((KDIR / "secret-api-keys.example.yaml").resolve())
    covered.add((KDIR / "scheduler/kube-scheduler-config.yaml").resolve())
    covered = {Path(p).resolve() for p in covered}
    orphans = []
    for p in sorted(KDIR.rglob("*")):
        if p.is_dir() or p.suffix not in {".yaml", ".yml", ".toml", ".json"}:
            continue
        if p.resolve().is_relative_to(HERE):                       # this checker's own files
            continue
        if p.resolve() not in covered:
            orphans.append(rel(p))
    R.check(not orphans, "every manifest, policy and dashboard file is checked",
            f"not covered by any check (list it in a kustomization, examples/, or check.py): {orphans}")


# ---------------------------------------------------------------- k8s

def validate_builtin(doc, source):
    for version in K8S_VERSIONS:
        what = f"{source}: {name_of(doc)} [k8s {version} strict]"
        try:
            kubernetes_validate.validate(doc, version, strict=True)
            R.ok(what)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(x) for x in e.path)
            R.fail(what, f"{path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            R.fail(what, e.message)


# ---------------------------------------------------------------- crd

JUNCTOR_FORBIDDEN = {"type", "additionalProperties", "description", "default", "nullable",
                     "title", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource",
                     "x-kubernetes-map-type", "x-kubernetes-list-type", "x-kubernetes-validations"}


def structural_problems(schema, path="openAPIV3Schema", in_junctor=False):
    """The structural-schema rules the API server applies to a CRD that a
    plain JSON-schema check does not: every node has a type; junctors
    (allOf, anyOf, oneOf, not) carry only value validations."""
    out = []
    if in_junctor:
        bad = JUNCTOR_FORBIDDEN & set(schema)
        if bad:
            out.append(f"{path}: {sorted(bad)} not allowed inside allOf/anyOf/oneOf/not")
    elif "type" not in schema and not schema.get("x-kubernetes-int-or-string") \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out.append(f"{path}: no type")
    if "properties" in schema and "additionalProperties" in schema:
        out.append(f"{path}: properties and additionalProperties together")
    for name, sub in (schema.get("properties") or {}).items():
        out += structural_problems(sub, f"{path}.properties.{name}", in_junctor)
    if isinstance(schema.get("items"), dict):
        out += structural_problems(schema["items"], f"{path}.items", in_junctor)
    if isinstance(schema.get("additionalProperties"), dict):
        out += structural_problems(schema["additionalProperties"], f"{path}.additionalProperties", in_junctor)
    for j in ("allOf", "anyOf", "oneOf"):
        for i, sub in enumerate(schema.get(j) or []):
            out += structural_problems(sub, f"{path}.{j}[{i}]", True)
    if "not" in schema:
        out += structural_problems(schema["not"], f"{path}.not", True)
    return out


def strict_schema(schema):
    """The schema with unknown fields refused, as kubectl's default strict
    field validation refuses them (the API server would otherwise prune them)."""
    s = copy.deepcopy(schema)

    def walk(node, top):
        if not isinstance(node, dict):
            return
        if "properties" in node and "additionalProperties" not in node \
                and not node.get("x-kubernetes-preserve-unknown-fields") and not top:
            node["additionalProperties"] = False
        for sub in (node.get("properties") or {}).values():
            walk(sub, False)
        if isinstance(node.get("items"), dict):
            walk(node["items"], False)
        for j in ("allOf", "anyOf", "oneOf"):
            for sub in node.get(j) or []:
                walk(sub, False)
    walk(s, True)
    # The object's top: apiVersion, kind, metadata, spec and nothing else.
    s["additionalProperties"] = False
    return s


def apply_defaults(schema, value):
    """Fills in the schema's defaults where a field is absent, as the API
    server does before it validates a custom resource: top down, so that a
    defaulted object gets its own fields' defaults too."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for name, sub in props.items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
        for name, sub in props.items():
            if name in value:
                apply_defaults(sub, value[name])
        if isinstance(schema.get("additionalProperties"), dict):
            for name, v in value.items():
                if name not in props:
                    apply_defaults(schema["additionalProperties"], v)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for v in value:
            apply_defaults(schema["items"], v)


_cel_env = celpy.Environment()
_cel_programs = {}


def cel_problems(schema, value, path=""):
    """The schema's x-kubernetes-validations (CEL) rules on the value, each
    where it is declared, as the API server evaluates them on a create.
    Transition rules (those reading oldSelf) apply to updates only and are
    left out."""
    out = []
    for r in schema.get("x-kubernetes-validations") or []:
        rule = r["rule"]
        if re.search(r"\boldSelf\b", rule):
            continue
        try:
            if rule not in _cel_programs:
                _cel_programs[rule] = _cel_env.program(_cel_env.compile(rule))
            result = _cel_programs[rule].evaluate({"self": celpy.json_to_cel(value)})
        except Exception as e:          # celpy's own parse and evaluation errors
            result = e
        where = path or "(top)"
        if isinstance(result, Exception):
            out.append(f"{where}: rule {rule!r} failed to evaluate: {result}")
        elif not bool(result):
            out.append(f"{where}: {r.get('message') or 'rule ' + repr(rule)}")
    props = schema.get("properties") or {}
    if isinstance(value, dict):
        for name, v in value.items():
            sub = props.get(name)
            if sub is None and isinstance(schema.get("additionalProperties"), dict):
                sub = schema["additionalProperties"]
            if sub is not None:
                out += cel_problems(sub, v, f"{path}.{name}" if path else name)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            out += cel_problems(schema["items"], v, f"{path}[{i}]")
    return out


DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class CrdValidator:
    """A custom resource against one version of its CRD, as the API server
    and kubectl's strict field validation take it: apiVersion and kind; the
    name; metadata.namespace as the CRD's scope wants it; then, on a copy with
    the schema's defaults filled in, the schema with unknown fields refused
    and the CEL rules."""

    def __init__(self, crd, version=None):
        spec = crd["spec"]
        v = next(v for v in spec["versions"] if version in (None, v["name"]))
        self.api_version = f"{spec['group']}/{v['name']}"
        self.kind = spec["names"]["kind"]
        self.namespaced = spec["scope"] == "Namespaced"
        self.schema = v["schema"]["openAPIV3Schema"]
        # OpenAPI 3.0 schemas are draft-4 style (boolean exclusiveMinimum).
        self.validator = jsonschema.Draft4Validator(strict_schema(self.schema))

    def name_errors(self, name):
        if len(name) > 253 or not DNS_SUBDOMAIN.match(name):
            return [f"metadata.name {name!r}: not a DNS subdomain (lowercase letters, digits, '-' and '.')"]
        return []

    def errors(self, doc):
        errs = []
        if kind_key(doc) != (self.api_version, self.kind):
            errs.append(f"apiVersion/kind {kind_key(doc)}, expected {(self.api_version, self.kind)}")
        meta = doc.get("metadata") or {}
        errs += self.name_errors(meta.get("name") or "")
        if self.namespaced and not meta.get("namespace"):
            errs.append(f"metadata.namespace: a {self.kind} is namespaced; name its namespace")
        if not self.namespaced and "namespace" in meta:
            errs.append(f"metadata.namespace: a {self.kind} is cluster-scoped")
        d = copy.deepcopy(doc)
        apply_defaults(self.schema, d)
        for e in sorted(self.validator.iter_errors(d), key=lambda e: list(e.path)):
            errs.append(f"{'.'.join(str(x) for x in e.path) or '(top)'}: {e.message}")
        errs += cel_problems(self.schema, d)
        return errs


TENANT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class TbaValidator(CrdValidator):
    def name_errors(self, name):
        if not TENANT_NAME.match(name):
            return [f"metadata.name {name!r}: lowercase letters, digits and '-'"]
        return []


def check_crd(crd_doc, tba_docs):
    print("crd")
    schema = crd_doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    problems = structural_problems(schema)
    R.check(not problems, "TokenBucketAdmission CRD: structural schema", "; ".join(problems))
    try:
        jsonschema.Draft4Validator.check_schema(schema)
        R.ok("TokenBucketAdmission CRD: openAPIV3Schema is a valid JSON schema")
    except jsonschema.SchemaError as e:
        R.fail("TokenBucketAdmission CRD: openAPIV3Schema is a valid JSON schema", e.message)
    v = TbaValidator(crd_doc)
    for source, doc in tba_docs:
        errs = v.errors(doc)
        R.check(not errs, f"{source}: {name_of(doc)} against the CRD", "; ".join(errs))

    # Broken resources must be refused.
    good = next(d for s, d in tba_docs if s.endswith("tokenbucketadmission-acme-corp.yaml"))

    def mutated(fn):
        d = copy.deepcopy(good)
        fn(d)
        return d

    def drop_keys(d):
        d["spec"].pop("apiKeySha256", None)
        d["spec"].pop("apiKeyEnv", None)

    broken = {
        "perTenantRate: -1": lambda d: d["spec"].update(perTenantRate=-1),
        "perTenantRate: 0": lambda d: d["spec"].update(perTenantRate=0),
        "perTenantBurst: 0": lambda d: d["spec"].update(perTenantBurst=0),
        "perTenantBurst: 1.5": lambda d: d["spec"].update(perTenantBurst=1.5),
        "maxConcurrency: 0": lambda d: d["spec"].update(maxConcurrency=0),
        "gpuSecondsPerHour: 0": lambda d: d["spec"].update(gpuSecondsPerHour=0),
        "weight: 0": lambda d: d["spec"].update(weight=0),
        "no key source": drop_keys,
        "apiKeySha256 not 64 hex": lambda d: d["spec"].update(apiKeySha256=["abc123"]),
        "apiKeySha256 empty list": lambda d: d["spec"].update(apiKeySha256=[]),
        "apiKeyEnv not a variable name": lambda d: d["spec"].update(apiKeyEnv="1-BAD"),
        "priority: urgent": lambda d: d["spec"].update(priority="urgent"),
        "onLate: drop": lambda d: d["spec"].update(onLate="drop"),
        "slo.ttft without unit": lambda d: d["spec"]["slo"].update(ttft="500"),
        "slo unknown key": lambda d: d["spec"]["slo"].update(p99="1s"),
        "burst without rate": lambda d: d["spec"].pop("perTenantRate"),
        "unknown spec field perTenantRates": lambda d: d["spec"].update(perTenantRates=5),
        "policy-style key rate": lambda d: d["spec"].update(rate=5),
        "unknown top-level field": lambda d: d.update(status={}),
        "matchExpressions operator Like": lambda d: d["spec"]["namespaceSelector"].update(
            matchExpressions=[{"key": "tenant", "operator": "Like", "values": ["x"]}]),
        "metadata.name with a dot": lambda d: d["metadata"].update(name="acme.corp"),
        "wrong apiVersion": lambda d: d.update(apiVersion="slo.fairway.dev/v2"),
    }
    for label, fn in broken.items():
        errs = v.errors(mutated(fn))
        R.check(bool(errs), f"negative: {label} is refused", "the CRD schema accepted it")

    # The twin: the example is config/acme-corp.toml's tenant, field for field.
    tenant = tomllib.load(open(REPO / "config/acme-corp.toml", "rb"))["tenants"][0]
    s = good["spec"]
    as_policy = {"name": good["metadata"]["name"]}
    mapping = {"perTenantRate": "rate", "perTenantBurst": "burst", "maxConcurrency": "max_concurrency",
               "gpuSecondsPerHour": "gpu_seconds_per_hour", "weight": "weight", "priority": "priority",
               "apiKeyEnv": "api_key_env", "onLate": "on_late", "adapters": "adapters", "slo": "slo"}
    for k, pk in mapping.items():
        if k in s:
            as_policy[pk] = s[k]
    if "apiKeySha256" in s:
        keys = s["apiKeySha256"]
        as_policy["api_key_sha256"] = keys[0] if len(keys) == 1 else keys
    R.check(as_policy == tenant, "examples/tokenbucketadmission-acme-corp.yaml equals config/acme-corp.toml's tenant",
            f"CR as policy {as_policy} != toml {tenant}")


# ---------------------------------------------------------------- kueue

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v0.19.2"           # validate/kueue/README.md: where the CRDs come from
KUEUE_API = "v1beta2"
KUEUE_CRDS = {                      # file: SHA-256, as released
    "kueue.x-k8s.io_resourceflavors.yaml": "19e339c47e9ca3fa2c9eeddd27715a512f765c4794ed859733408a9715720173",
    "kueue.x-k8s.io_clusterqueues.yaml": "e0a5fc9b370c70f3d993d4f599865817338ecf94187b30b15b12ff33c579bd55",
    "kueue.x-k8s.io_localqueues.yaml": "dd10ef8d3578e7212fa52763549e7b6be0949793a5b924495fcd293330109fed",
}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GATE = "kueue.x-k8s.io/admission"

QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$")
QUANTITY_SUFFIX = {"": 1, "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
                   "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
                   "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(v):
    """A Kubernetes resource quantity ("4", "20m", "24Gi", 2) as a Fraction."""
    m = QUANTITY.match(str(v).strip())
    if not m:
        raise ValueError(f"not a quantity: {v!r}")
    suffix = m[2] or ""
    if suffix[:1] in ("e", "E"):
        return Fraction(m[1]) * Fraction(10) ** int(suffix[1:])
    return Fraction(m[1]) * QUANTITY_SUFFIX[suffix]


def pod_requests(template):
    """What one pod of a template requests, as Kueue counts it: each
    container's requests (a limit without a request counts as the request,
    as the API server defaults it), summed; an init container's count where
    it is larger; the pod overhead."""
    def of(c):
        res = c.get("resources") or {}
        req = {k: quantity(v) for k, v in (res.get("limits") or {}).items()}
        req.update({k: quantity(v) for k, v in (res.get("requests") or {}).items()})
        return req
    spec = template["spec"]
    total = {}
    for c in spec.get("containers", []):
        for k, v in of(c).items():
            total[k] = total.get(k, 0) + v
    for c in spec.get("initContainers", []):
        for k, v in of(c).items():
            total[k] = max(total.get(k, 0), v)
    for k, v in (spec.get("overhead") or {}).items():
        total[k] = total.get(k, 0) + quantity(v)
    return total


def selector_matches(sel, labels):
    """A metav1.LabelSelector against a set of labels (null matches nothing,
    {} everything: Kueue's reading of a ClusterQueue's namespaceSelector)."""
    if sel is None:
        return False
    if any(labels.get(k) != v for k, v in (sel.get("matchLabels") or {}).items()):
        return False
    for e in sel.get("matchExpressions") or []:
        k, op, vals = e["key"], e["operator"], e.get("values") or []
        ok = {"In": k in labels and labels[k] in vals, "NotIn": labels.get(k) not in vals,
              "Exists": k in labels, "DoesNotExist": k not in labels}.get(op, False)
        if not ok:
            return False
    return True


def cluster_queue_problems(cq):
    """A ClusterQueue's rules that Kueue's own webhook checks beyond the
    CRD's schema and CEL, as its API documents them: each flavor lists the
    group's covered resources by name in the same order; a resource is
    covered by one group and a flavor is in one group only."""
    out = []
    seen_res, seen_flv = set(), set()
    for i, rg in enumerate((cq.get("spec") or {}).get("resourceGroups") or []):
        covered = rg.get("coveredResources") or []
        for r in covered:
            if r in seen_res:
                out.append(f"spec.resourceGroups[{i}]: resource {r} is covered twice")
            seen_res.add(r)
        for j, f in enumerate(rg.get("flavors") or []):
            names = [r.get("name") for r in f.get("resources") or []]
            if names[:len(covered)] != covered[:len(names)]:
                out.append(f"spec.resourceGroups[{i}].flavors[{j}] ({f.get('name')}): resources {names} "
                           f"not the coveredResources {covered} in their order")
            if f.get("name") in seen_flv:
                out.append(f"spec.resourceGroups[{i}].flavors[{j}]: flavor {f.get('name')} is listed twice")
            seen_flv.add(f.get("name"))
    return out


def queued_workload_problems(wl, kdocs, docs):
    """Whether a workload labelled with a Kueue queue composes with the
    queues and with Fairway's placement:
      - its LocalQueue exists in its namespace, and that LocalQueue's
        ClusterQueue, whose namespaceSelector admits the namespace, and
        whose flavors are ResourceFlavors here;
      - the ClusterQueue covers every resource a pod requests, and one of
        its flavors holds every pod of the workload (else it is never
        admitted);
      - every node a flavor sends the pods to runs a Fairway node agent
        (the agent DaemonSet's nodeSelector is within the flavor's
        nodeLabels), and the pod's own nodeSelector does not contradict the
        flavor's (Kueue refuses to merge them);
      - the pods still go through Fairway's pod webhook (its objectSelector
        and namespaceSelector) with their size annotation, and carry no
        scheduling gate of Kueue's before Kueue adds it."""
    out = []
    meta = wl["metadata"]
    ns, qname = meta.get("namespace"), meta["labels"][QUEUE_LABEL]
    tmpl = wl["spec"]["template"]
    lq = find(kdocs, "LocalQueue", qname, ns)
    if lq is None:
        return [f"no LocalQueue {ns}/{qname}"]
    cq = find(kdocs, "ClusterQueue", lq["spec"].get("clusterQueue"))
    if cq is None:
        return [f"LocalQueue {ns}/{qname}: no ClusterQueue {lq['spec'].get('clusterQueue')}"]
    ns_doc = find(docs, "Namespace", ns)
    ns_labels = {**((ns_doc or {}).get("metadata", {}).get("labels") or {}), "kubernetes.io/metadata.name": ns}
    if not selector_matches(cq["spec"].get("namespaceSelector"), ns_labels):
        out.append(f"ClusterQueue {cq['metadata']['name']}: its namespaceSelector does not admit namespace {ns}")
    flavors = {}
    for rg in cq["spec"].get("resourceGroups") or []:
        for f in rg["flavors"]:
            rf = find(kdocs, "ResourceFlavor", f["name"])
            if rf is None:
                out.append(f"ClusterQueue {cq['metadata']['name']}: no ResourceFlavor {f['name']}")
            else:
                flavors[f["name"]] = rf
    replicas = wl["spec"].get("replicas", 1)
    need = {k: v * replicas for k, v in pod_requests(tmpl).items()}
    groups = cq["spec"].get("resourceGroups") or []
    for res in sorted(set(need) - {r for g in groups for r in g["coveredResources"]}):
        out.append(f"the pods request {res}, which ClusterQueue {cq['metadata']['name']} does not cover")
    for g in groups:
        group_need = {r: need.get(r, 0) for r in g["coveredResources"]}
        if not any(group_need.values()):
            continue
        quotas = {f["name"]: {q["name"]: quantity(q["nominalQuota"]) for q in f["resources"]} for f in g["flavors"]}
        if not any(all(q.get(r, 0) >= n for r, n in group_need.items()) for q in quotas.values()):
            amounts = ", ".join(f"{r} {float(n) / 2**30:.1f}Gi" if r == "memory" or r.endswith("storage")
                                else f"{r} {float(n):g}" for r, n in group_need.items())
            out.append(f"{replicas} pods need {amounts}: "
                       f"more than any flavor's nominalQuota in ClusterQueue {cq['metadata']['name']}")
    agent = find(docs, "DaemonSet", "fairway-agent", "fairway")
    agent_sel = agent["spec"]["template"]["spec"].get("nodeSelector") or {}
    pod_sel = tmpl["spec"].get("nodeSelector") or {}
    for name, rf in flavors.items():
        labels = rf["spec"].get("nodeLabels") or {}
        if any(labels.get(k) != v for k, v in agent_sel.items()):
            out.append(f"ResourceFlavor {name}: nodeLabels {labels} may admit nodes without a Fairway node agent "
                       f"(the DaemonSet selects {agent_sel})")
        clash = {k for k in labels if k in pod_sel and pod_sel[k] != labels[k]}
        if clash:
            out.append(f"ResourceFlavor {name}: nodeLabels {sorted(clash)} contradict the pod's nodeSelector")
    vwc = find(docs, "ValidatingWebhookConfiguration", "fairway-placement")
    pod_hook = next(w for w in vwc["webhooks"] if w["name"] == "pods.placement.fairway.dev")
    t_labels = tmpl["metadata"].get("labels") or {}
    t_notes = tmpl["metadata"].get("annotations") or {}
    if not selector_matches(pod_hook.get("objectSelector", {}), t_labels):
        out.append(f"the pods' labels do not match Fairway's pod webhook objectSelector "
                   f"{pod_hook.get('objectSelector')}")
    if not selector_matches(pod_hook.get("namespaceSelector", {}), ns_labels):
        out.append(f"Fairway's pod webhook does not see namespace {ns}")
    if "fairway.dev/model-size-gb" not in t_notes:
        out.append("the pods have no fairway.dev/model-size-gb annotation: placement would not judge them")
    if any(g.get("name") == KUEUE_GATE for g in tmpl["spec"].get("schedulingGates") or []):
        out.append(f"the template carries {KUEUE_GATE} itself; Kueue's webhook adds it")
    return out


def check_kueue(kueue_docs, docs):
    """kueue_docs: (source, doc) of the kueue.x-k8s.io resources; docs: every
    document, with its _source."""
    print(f"kueue (CRDs of Kueue {KUEUE_VERSION}, {KUEUE_API}; CEL with cel-python)")
    vdir = HERE / "kueue"
    validators = {}
    for fname, digest in KUEUE_CRDS.items():
        path = vdir / fname
        got = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "missing"
        R.check(got == digest, f"validate/kueue/{fname}: Kueue {KUEUE_VERSION}'s file, unmodified",
                f"sha256 {got}, expected {digest} (validate/kueue/README.md)")
        if not path.exists():
            continue
        crd = yaml.safe_load(path.read_text())
        v = CrdValidator(crd, KUEUE_API)
        try:
            jsonschema.Draft4Validator.check_schema(v.schema)
        except jsonschema.SchemaError as e:
            R.fail(f"{v.kind} {KUEUE_API}: openAPIV3Schema is a valid JSON schema", e.message)
        validators[(v.api_version, v.kind)] = v

    def errors(doc):
        v = validators.get(kind_key(doc))
        if v is None:
            return [f"no Kueue {KUEUE_API} CRD for {kind_key(doc)}"]
        errs = v.errors(doc)
        if doc.get("kind") == "ClusterQueue":
            errs += cluster_queue_problems(doc)
        return errs

    for (_, kind) in validators:
        R.check(any(d.get("kind") == kind for _, d in kueue_docs), f"the manifests have a {kind}",
                "none found; is components/kueue rendered?")
    for source, doc in kueue_docs:
        errs = errors(doc)
        R.check(not errs, f"{source}: {name_of(doc)} against Kueue's CRD [{KUEUE_API} strict, CEL]", "; ".join(errs))

    # Broken resources must be refused.
    first = {}
    for _, d in kueue_docs:
        first.setdefault(d["kind"], d)

    def res0(d):
        return d["spec"]["resourceGroups"][0]["flavors"][0]["resources"]

    broken = [
        ("ClusterQueue", "a flavor missing a covered resource", lambda d: res0(d).pop()),
        ("ClusterQueue", "flavor resources out of coveredResources' order",
         lambda d: res0(d).insert(0, res0(d).pop())),
        ("ClusterQueue", "nominalQuota: four", lambda d: res0(d)[0].update(nominalQuota="four")),
        ("ClusterQueue", "nominalQuota: 0.5 (a number, not a quantity string)",
         lambda d: res0(d)[0].update(nominalQuota=0.5)),
        ("ClusterQueue", "borrowingLimit without a cohort", lambda d: res0(d)[0].update(borrowingLimit=1)),
        ("ClusterQueue", "v1beta1's spec.cohort", lambda d: d["spec"].update(cohort="gpus")),
        ("ClusterQueue", "queueingStrategy: FIFO", lambda d: d["spec"].update(queueingStrategy="FIFO")),
        ("ClusterQueue", "preemption.withinClusterQueue: Always",
         lambda d: d["spec"]["preemption"].update(withinClusterQueue="Always")),
        ("ClusterQueue", "borrowWithinCohort preempting while reclaimWithinCohort is Never",
         lambda d: d["spec"]["preemption"].update(borrowWithinCohort={"policy": "LowerPriority"})),
        ("ClusterQueue", "a namespace (cluster-scoped)", lambda d: d["metadata"].update(namespace="models")),
        ("ClusterQueue", "apiVersion kueue.x-k8s.io/v1alpha1",
         lambda d: d.update(apiVersion="kueue.x-k8s.io/v1alpha1")),
        ("LocalQueue", "clusterQueue: Model_Servers", lambda d: d["spec"].update(clusterQueue="Model_Servers")),
        ("LocalQueue", "no namespace", lambda d: d["metadata"].pop("namespace")),
        ("LocalQueue", "stopPolicy: Pause", lambda d: d["spec"].update(stopPolicy="Pause")),
        ("ResourceFlavor", "a nodeLabels value that is a boolean",
         lambda d: d["spec"]["nodeLabels"].update({"nvidia.com/gpu.present": True})),
        ("ResourceFlavor", "a toleration with operator Equal and no key",
         lambda d: d["spec"].update(tolerations=[{"operator": "Equal", "value": "x", "effect": "NoSchedule"}])),
        ("ResourceFlavor", "a topologyName and no nodeLabels",
         lambda d: d.update(spec={"topologyName": "default", "nodeLabels": {}})),
        ("ResourceFlavor", "spec.nodeSelector (for nodeLabels)", lambda d: d["spec"].update(nodeSelector={})),
    ]
    for kind, label, fn in broken:
        if kind not in first:
            continue
        d = copy.deepcopy(first[kind])
        fn(d)
        R.check(bool(errors(d)), f"negative: {kind} with {label} is refused", "accepted")

    # The composition: every workload labelled with a queue.
    kdocs = [d for _, d in kueue_docs]
    queued = [d for d in docs if d.get("kind") in ("StatefulSet", "Deployment")
              and QUEUE_LABEL in ((d.get("metadata") or {}).get("labels") or {})]
    R.check(bool(queued), f"the manifests have a workload labelled {QUEUE_LABEL}", "none")
    for wl in queued:
        problems = queued_workload_problems(wl, kdocs, docs)
        R.check(not problems, f"{wl['_source']}: {name_of(wl)}: its LocalQueue, ClusterQueue and flavor exist and "
                "admit it, the quota holds all its pods, every flavor node runs a node agent, "
                "Fairway's pod webhook sees it", "; ".join(problems))
    if queued:
        wl = queued[0]
        cq_name = find(kdocs, "LocalQueue", wl["metadata"]["labels"][QUEUE_LABEL],
                       wl["metadata"].get("namespace"))["spec"]["clusterQueue"]

        def on_cq(fn):
            def apply(w, k):
                fn(find(k, "ClusterQueue", cq_name))
            return apply

        def flavor_of(k):
            name = find(k, "ClusterQueue", cq_name)["spec"]["resourceGroups"][0]["flavors"][0]["name"]
            return find(k, "ResourceFlavor", name)

        for label, fn in {
            "a queue-name without a LocalQueue": lambda w, k: w["metadata"]["labels"].update({QUEUE_LABEL: "nowhere"}),
            "a GPU quota smaller than its pods": on_cq(lambda cq: res0(cq)[0].update(nominalQuota=1)),
            "a resource the ClusterQueue does not cover": lambda w, k: w["spec"]["template"]["spec"]["containers"][0]
                ["resources"]["requests"].update({"ephemeral-storage": "10Gi"}),
            "a ClusterQueue closed to its namespace": on_cq(lambda cq: cq["spec"].pop("namespaceSelector")),
            "a flavor with no ResourceFlavor": on_cq(lambda cq: cq["spec"]["resourceGroups"][0]["flavors"][0]
                                                     .update(name="h100")),
            "a flavor wider than the node agents' nodes": lambda w, k: flavor_of(k)["spec"].update(
                nodeLabels={"kubernetes.io/os": "linux"}),
            "a nodeSelector contradicting the flavor": lambda w, k: w["spec"]["template"]["spec"].update(
                nodeSelector={"nvidia.com/gpu.present": "false"}),
            "no fairway.dev/placement label": lambda w, k: w["spec"]["template"]["metadata"]["labels"]
                .pop("fairway.dev/placement"),
        }.items():
            w, k = copy.deepcopy(wl), copy.deepcopy(kdocs)
            fn(w, k)
            R.check(bool(queued_workload_problems(w, k, docs)),
                    f"negative: a queued model server with {label} is refused", "accepted")


def check_kueue_twin():
    """components/kueue/model-server.yaml is examples/vllm-model-server.yaml
    plus the queue label and a fixed size: nothing else differs."""
    comp = load_docs(KDIR / "components/kueue/model-server.yaml")
    example = load_docs(KDIR / "examples/vllm-model-server.yaml")

    def strip(d):
        d = copy.deepcopy(d)
        if d.get("kind") == "StatefulSet":
            d["metadata"].get("labels", {}).pop(QUEUE_LABEL, None)
            d["spec"].pop("replicas", None)
        return d
    same = [strip(d) for d in comp] == [strip(d) for d in example]
    sts = find(comp, "StatefulSet", "vllm-llama-3-1-8b", "models")
    R.check(same and sts is not None and QUEUE_LABEL in sts["metadata"].get("labels", {})
            and isinstance(sts["spec"].get("replicas"), int),
            "components/kueue/model-server.yaml is examples/vllm-model-server.yaml with a queue label and a fixed size",
            "they differ elsewhere: make the same change to both files")
    return sts


# ---------------------------------------------------------------- scheduler

# kube-scheduler's config v1 Go types (k8s.io/kube-scheduler/config/v1),
# their JSON names.
SCHED_TOP = {"apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
             "enableProfiling", "enableContentionProfiling", "percentageOfNodesToScore",
             "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles", "extenders",
             "delayCacheUntilActive"}
EXTENDER = {"urlPrefix": str, "filterVerb": str, "preemptVerb": str, "prioritizeVerb": str,
            "bindVerb": str, "weight": int, "enableHTTPS": bool, "tlsConfig": dict,
            "httpTimeout": str, "nodeCacheCapable": bool, "managedResources": list, "ignorable": bool}
EXTENDER_TLS = {"insecure": bool, "serverName": str, "certFile": str, "keyFile": str, "caFile": str,
                "certData": str, "keyData": str, "caData": str}
MANAGED_RESOURCE = {"name": str, "ignoredByScheduler": bool}
PROFILE = {"schedulerName", "plugins", "pluginConfig"}
GO_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")


def typed_fields(obj, fields, where):
    out = []
    if not isinstance(obj, dict):
        return [f"{where}: not a mapping"]
    for k, v in obj.items():
        if k not in fields:
            out.append(f"{where}.{k}: unknown field")
        elif fields[k] is int and (isinstance(v, bool) or not isinstance(v, int)):
            out.append(f"{where}.{k}: not an integer")
        elif fields[k] is not int and not isinstance(v, fields[k]):
            out.append(f"{where}.{k}: not a {fields[k].__name__}")
    return out


def scheduler_problems(cfg):
    out = []
    if cfg.get("apiVersion") != "kubescheduler.config.k8s.io/v1":
        out.append(f"apiVersion {cfg.get('apiVersion')!r}, expected kubescheduler.config.k8s.io/v1")
    if cfg.get("kind") != "KubeSchedulerConfiguration":
        out.append(f"kind {cfg.get('kind')!r}, expected KubeSchedulerConfiguration")
    out += [f"{k}: unknown top-level field" for k in cfg if k not in SCHED_TOP]
    for i, p in enumerate(cfg.get("profiles") or []):
        out += [f"profiles[{i}].{k}: unknown field" for k in p if k not in PROFILE]
    extenders = cfg.get("extenders") or []
    if not extenders:
        out.append("no extenders")
    for i, e in enumerate(extenders):
        w = f"extenders[{i}]"
        out += typed_fields(e, EXTENDER, w)
        if not isinstance(e, dict):
            continue
        if "urlPrefix" not in e:
            out.append(f"{w}.urlPrefix: required")
        if e.get("enableHTTPS") != str(e.get("urlPrefix", "")).startswith("https://"):
            out.append(f"{w}: enableHTTPS must match the urlPrefix's scheme")
        if "weight" in e and isinstance(e["weight"], int) and e["weight"] <= 0:
            out.append(f"{w}.weight: must be positive")
        if "prioritizeVerb" in e and "weight" not in e:
            out.append(f"{w}.weight: needed with prioritizeVerb")
        if "httpTimeout" in e and not GO_DURATION.match(str(e["httpTimeout"])):
            out.append(f"{w}.httpTimeout: not a Go duration")
        if "tlsConfig" in e:
            out += typed_fields(e["tlsConfig"], EXTENDER_TLS, f"{w}.tlsConfig")
        for j, m in enumerate(e.get("managedResources") or []):
            out += typed_fields(m, MANAGED_RESOURCE, f"{w}.managedResources[{j}]")
            if isinstance(m, dict) and "name" not in m:
                out.append(f"{w}.managedResources[{j}].name: required")
    return out


def check_scheduler(path):
    print("scheduler")
    cfg = yaml.safe_load(open(path))
    problems = scheduler_problems(cfg)
    R.check(not problems, f"{rel(path)}: KubeSchedulerConfiguration fields", "; ".join(problems))
    for label, fn in {
        "misspelled extender field prioritiseVerb": lambda c: c["extenders"][0].update(prioritiseVerb="x"),
        "weight as a string": lambda c: c["extenders"][0].update(weight="5"),
        "httpTimeout without unit": lambda c: c["extenders"][0].update(httpTimeout="5"),
        "unknown tlsConfig field caFiles": lambda c: c["extenders"][0]["tlsConfig"].update(caFiles="x"),
        "apiVersion v1beta3": lambda c: c.update(apiVersion="kubescheduler.config.k8s.io/v1beta3"),
    }.items():
        c = copy.deepcopy(cfg)
        fn(c)
        R.check(bool(scheduler_problems(c)), f"negative: scheduler config with {label} is refused", "accepted")
    return cfg


# ---------------------------------------------------------------- consistency

def port_of(addr):
    return int(str(addr).rsplit(":", 1)[1])


def find(docs, kind, name, namespace=None):
    for d in docs:
        m = d.get("metadata") or {}
        if d.get("kind") == kind and m.get("name") == name and (namespace is None or m.get("namespace") == namespace):
            return d
    return None


def container(workload, name):
    for c in workload["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    return None


def named_port(c, name):
    return next((p["containerPort"] for p in c.get("ports", []) if p.get("name") == name), None)


def check_consistency(docs, cfg_sched):
    print("consistency")
    policy_text = (KDIR / "config/fairway.toml").read_bytes()
    try:
        pol = tomllib.loads(policy_text.decode())
        R.ok("config/fairway.toml parses as TOML")
    except tomllib.TOMLDecodeError as e:
        R.fail("config/fairway.toml parses as TOML", str(e))
        return
    cm = find(docs, "ConfigMap", "fairway-policy", "fairway")
    R.check(cm and set(cm.get("data", {})) >= {"fairway.toml", *pol.get("tenant_resources", [])},
            "ConfigMap fairway-policy holds fairway.toml and every tenant_resources file",
            f"data keys {sorted((cm or {}).get('data', {}))}, tenant_resources {pol.get('tenant_resources')}")
    # (Which file the rendered ConfigMap holds, and the store it names: check_store.)

    gw = find(docs, "Deployment", "fairway-gateway", "fairway")
    pl = find(docs, "Deployment", "fairway-placement", "fairway")
    gc, pc = container(gw, "gateway"), container(pl, "placement")
    srv, plc = pol.get("server", {}), pol.get("placement", {})
    R.check(named_port(gc, "api") == port_of(srv["listen"]) and named_port(gc, "admin") == port_of(srv["admin_listen"]),
            "gateway ports api/admin match [server] listen/admin_listen",
            f"{named_port(gc, 'api')}/{named_port(gc, 'admin')} vs {srv.get('listen')}/{srv.get('admin_listen')}")
    R.check(named_port(pc, "https") == port_of(plc["listen"]), "placement port https matches [placement] listen",
            f"{named_port(pc, 'https')} vs {plc.get('listen')}")
    for wl, c, label in ((gw, gc, "gateway"), (pl, pc, "placement")):
        args = c.get("args", [])
        cfg_path = args[args.index("--config") + 1] if "--config" in args else None
        mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
        vols = {v["name"]: v for v in wl["spec"]["template"]["spec"]["volumes"]}
        pm = mounts.get("policy", {})
        R.check(cfg_path == f"{pm.get('mountPath')}/fairway.toml" and "subPath" not in pm
                and vols.get("policy", {}).get("configMap", {}).get("name") == "fairway-policy",
                f"{label}: --config is fairway.toml in the fairway-policy ConfigMap, mounted as a directory",
                f"--config {cfg_path}, mount {pm}")
    tls_mount = next((m for m in pc["volumeMounts"] if m["name"] == "tls"), {})
    tls_vol = next((v for v in pl["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"), {})
    tls = plc.get("tls", {})
    R.check(all(str(tls.get(k, "")).startswith(tls_mount.get("mountPath", "?") + "/") for k in ("cert", "key")),
            "[placement] tls files are in the mounted Secret", f"{tls} vs mount {tls_mount}")

    # The agents placement reads are headless Services with that port.
    for entry in plc.get("agents_dns", []):
        host, port = entry.rsplit(":", 1)
        parts = host.split(".")
        svc = find(docs, "Service", parts[0], parts[1])
        R.check(svc is not None and svc["spec"].get("clusterIP") == "None"
                and any(p["port"] == int(port) for p in svc["spec"]["ports"])
                and host.endswith(".svc.cluster.local"),
                f"agents_dns {entry}: a headless Service with that port", "no such Service in the manifests")

    # Secrets: every key variable the gateway needs is in the example Secret.
    secret = find(docs, "Secret", "fairway-api-keys", "fairway")
    names = {d["spec"]["apiKeyEnv"] for d in docs if d.get("kind") == "TokenBucketAdmission"
             and "apiKeyEnv" in d["spec"] and d.get("_source", "").startswith("config/")}
    if "admin_token_env" in srv:
        names.add(srv["admin_token_env"])
    clu = pol.get("cluster")
    if clu and "password_env" in clu:
        names.add(clu["password_env"])
    have = set((secret or {}).get("stringData", {})) | set((secret or {}).get("data", {}))
    R.check(names <= have,
            "secret-api-keys.example.yaml has every apiKeyEnv, admin_token_env and password_env variable",
            f"missing {sorted(names - have)}")
    env_from = [e["secretRef"]["name"] for e in gc.get("envFrom", []) if "secretRef" in e]
    R.check(env_from == ["fairway-api-keys"], "gateway takes its environment from Secret fairway-api-keys",
            f"envFrom {env_from}")

    R.check(clu is not None, "config/fairway.toml has a [cluster] store: the replicas share the policy",
            "no [cluster] section: each replica would enforce the whole policy by itself")

    # The webhook calls the placement Service; its CA comes from the Certificate.
    vwc = find(docs, "ValidatingWebhookConfiguration", "fairway-placement")
    psvc = find(docs, "Service", "fairway-placement", "fairway")
    svc_port = psvc["spec"]["ports"][0]
    for wh in vwc["webhooks"]:
        s = wh["clientConfig"]["service"]
        R.check((s["name"], s["namespace"], s.get("port"), s.get("path")) ==
                ("fairway-placement", "fairway", svc_port["port"], "/validate")
                and svc_port["targetPort"] in ("https", named_port(pc, "https")),
                f"webhook {wh['name']} calls fairway-placement:9443/validate", str(s))
    cert = find(docs, "Certificate", "fairway-placement", "fairway")
    inject = (vwc["metadata"].get("annotations") or {}).get("cert-manager.io/inject-ca-from")
    R.check(cert is not None and inject == "fairway/fairway-placement"
            and cert["spec"]["secretName"] == tls_vol.get("secret", {}).get("secretName")
            and "fairway-placement.fairway.svc" in cert["spec"]["dnsNames"],
            "Certificate fairway-placement: the mounted Secret, the webhook's CA, the Service's DNS name",
            f"inject {inject}, cert {cert and cert['spec']}")
    ext = cfg_sched["extenders"][0]
    R.check(ext["urlPrefix"] == f"https://fairway-placement.fairway.svc:{svc_port['port']}"
            and ext.get("tlsConfig", {}).get("serverName") in cert["spec"]["dnsNames"],
            "scheduler extender: the placement Service's URL and a name the certificate has", ext["urlPrefix"])

    # Every Fairway container: the restricted Pod Security Standard, and more.
    for d in docs:
        if d.get("kind") not in ("Deployment", "DaemonSet", "StatefulSet"):
            continue
        pod = d["spec"]["template"]["spec"]
        psc = pod.get("securityContext", {})
        for c in pod["containers"]:
            if not c["image"].startswith("fairway:"):
                continue
            sc = {**psc, **c.get("securityContext", {})}
            problems = [k for k, good in (
                ("runAsNonRoot", sc.get("runAsNonRoot") is True),
                ("runAsUser 10001", sc.get("runAsUser") == 10001),
                ("readOnlyRootFilesystem", sc.get("readOnlyRootFilesystem") is True),
                ("allowPrivilegeEscalation false", sc.get("allowPrivilegeEscalation") is False),
                ("capabilities drop ALL", sc.get("capabilities", {}).get("drop") == ["ALL"]),
                ("seccompProfile RuntimeDefault", sc.get("seccompProfile", {}).get("type") == "RuntimeDefault"),
                ("no service account token", pod.get("automountServiceAccountToken") is False),
                ("no hostPath", not any("hostPath" in v for v in pod.get("volumes", []))),
                ("not privileged", not sc.get("privileged")),
            ) if not good]
            R.check(not problems, f"{name_of(d)} container {c['name']}: non-root, read-only, no privileges",
                    f"missing: {problems}")
    sa_docs = [d for d in docs if d.get("kind") == "ServiceAccount"]
    R.check(sa_docs and all(d.get("automountServiceAccountToken") is False for d in sa_docs)
            and not any(d.get("kind") in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding") for d in docs),
            "ServiceAccounts mount no token and no RBAC rule is granted", str([name_of(d) for d in sa_docs]))

    # The example model server, the pool, the agent sidecar and the ScaledObject
    # (components/kueue has a twin of the example: check_kueue_twin).
    example = [d for d in docs if d.get("_source") == "examples/vllm-model-server.yaml"]
    sts = find(example, "StatefulSet", "vllm-llama-3-1-8b", "models")
    so = find(docs, "ScaledObject", "vllm-llama-3-1-8b", "models")
    pools = pol.get("pools", [])
    model = pools[0]["model"]
    tmpl = sts["spec"]["template"]
    ann = tmpl["metadata"].get("annotations", {})
    vllm, agent = container(sts, "vllm"), container(sts, "fairway-agent")
    served = [a.split("=", 1)[1] for a in vllm["args"] if a.startswith("--served-model-name=")]
    agent_model = [a.split("=", 1)[1] for a in agent["args"] if a.startswith("--model=")]
    R.check(ann.get("fairway.dev/model") == model and served == [model] and agent_model == [model]
            and f'model="{model}"' in so["spec"]["triggers"][0]["metadata"]["query"],
            f"model {model!r}: pool, pod annotation, vLLM --served-model-name, agent --model, KEDA query",
            f"annotation {ann.get('fairway.dev/model')}, served {served}, agent {agent_model}")
    R.check(re.fullmatch(r"[0-9]+(\.[0-9]+)?", ann.get("fairway.dev/model-size-gb", "")) is not None
            and tmpl["metadata"]["labels"].get("fairway.dev/placement") == "enabled",
            "model pod: fairway.dev/model-size-gb is a number of GB, label fairway.dev/placement=enabled",
            str(tmpl["metadata"]))
    R.check(so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "vllm-llama-3-1-8b"},
            "ScaledObject scales the example StatefulSet", str(so["spec"]["scaleTargetRef"]))
    gov = sts["spec"]["serviceName"]
    expected = [f"http://{sts['metadata']['name']}-{i}.{gov}.models.svc.cluster.local:8000"
                for i in range(so["spec"]["maxReplicaCount"])]
    urls = [b["url"] for b in pools[0]["backends"]]
    R.check(urls == expected and find(example, "Service", gov, "models") is not None,
            "pool backends: one per StatefulSet pod up to maxReplicaCount, by the governing Service's DNS",
            f"{urls} vs {expected}")
    twin = check_kueue_twin()
    R.check(twin is not None and twin["spec"]["replicas"] <= len(urls),
            f"components/kueue's model server: its {twin and twin['spec'].get('replicas')} pods are all pool backends",
            f"more replicas than the {len(urls)} backends")


# ---------------------------------------------------------------- store

SENTINEL_COMPONENT = "components/store-sentinel"
SENTINEL_POLICY = SENTINEL_COMPONENT + "/fairway.toml"
SENTINEL_SCRIPT = SENTINEL_COMPONENT + "/store.sh"
PLAIN_STORE = re.compile(r"redis://([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local:([0-9]+)")
SENTINEL_STORE = re.compile(r"redis\+sentinel://([^/]+)/([A-Za-z0-9._-]+)")
# A pod of a StatefulSet by its governing Service: SET-N.SERVICE.NAMESPACE.svc.cluster.local,
# or SET-N.SERVICE in the gateways' namespace.
POD_HOST = re.compile(r"([a-z0-9-]+)-([0-9]+)\.([a-z0-9-]+)(?:\.([a-z0-9-]+)\.svc\.cluster\.local)?:([0-9]+)")


def policy_copy_problems(copy_text, original_text):
    """components/store-sentinel/fairway.toml against config/fairway.toml:
    line for line the same but the one `store = ` line of [cluster]."""
    a, b = original_text.split("\n"), copy_text.split("\n")
    if len(a) != len(b):
        return [f"{len(b)} lines, config/fairway.toml {len(a)}: make the same change to both files"]
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    out = [f"line {i + 1} differs ({b[i]!r}, config/fairway.toml {a[i]!r}): make the same change to both files"
           for i in diff if not (a[i].startswith("store = ") and b[i].startswith("store = "))]
    stores = [i for i in diff if a[i].startswith("store = ")]
    if len(stores) != 1:
        out.append(f"{len(stores)} store lines differ, expected exactly the [cluster] store")
    for i in stores:
        section = next((x.strip() for x in reversed(a[:i]) if x.startswith("[")), None)
        if section != "[cluster]":
            out.append(f"line {i + 1}: a store line in {section}, not in [cluster]")
    return out


def store_pod_security(sts):
    """The store pod against the restricted Pod Security Standard that the
    namespace enforces, and read-only root filesystems."""
    pod = sts["spec"]["template"]["spec"]
    psc = pod.get("securityContext", {})
    out = []
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = {**psc, **c.get("securityContext", {})}
        out += [f"container {c['name']}: {k}" for k, good in (
            ("runAsNonRoot", sc.get("runAsNonRoot") is True),
            ("readOnlyRootFilesystem", sc.get("readOnlyRootFilesystem") is True),
            ("allowPrivilegeEscalation false", sc.get("allowPrivilegeEscalation") is False),
            ("capabilities drop ALL", sc.get("capabilities", {}).get("drop") == ["ALL"]),
            ("seccompProfile RuntimeDefault", sc.get("seccompProfile", {}).get("type") == "RuntimeDefault"),
            ("not privileged", not sc.get("privileged")),
        ) if not good]
    if pod.get("automountServiceAccountToken") is not False:
        out.append("a service-account token is mounted")
    return out


def secret_ref(c, var):
    for e in (c or {}).get("env", []):
        if e["name"] == var:
            ref = e.get("valueFrom", {}).get("secretKeyRef", {})
            return (ref.get("name"), ref.get("key"))
    return None


def plain_store_checks(docs, clu):
    """[cluster] store = redis://SERVICE.NAMESPACE.svc.cluster.local:PORT:
    one Valkey behind that Service. (what, problems) pairs."""
    url = clu.get("store", "")
    m = PLAIN_STORE.fullmatch(url)
    if not m:
        return [(f"[cluster] store {url}", ["not redis://SERVICE.NAMESPACE.svc.cluster.local:PORT"])]
    svc, sts = find(docs, "Service", m[1], m[2]), find(docs, "StatefulSet", m[1], m[2])
    if not (svc and sts):
        return [(f"[cluster] store {url}", ["no such Service and StatefulSet in the manifests"])]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    vc = container(sts, "valkey") or {}
    args = vc.get("args", [])
    checks = []
    p = []
    if not any(x["port"] == int(m[3]) for x in svc["spec"]["ports"]):
        p.append(f"the Service has no port {m[3]}")
    if not all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()):
        p.append("the Service does not select the StatefulSet's pods")
    if sts["spec"].get("replicas", 1) != 1:
        p.append(f"{sts['spec'].get('replicas')} pods behind one name: a call may reach any of them "
                 f"(with {SENTINEL_COMPONENT}, the policy names the sentinels)")
    checks.append((f"[cluster] store {url}: a Service with that port in front of the store's one pod", p))
    p = []
    if not ("--requirepass" in args and args[args.index("--requirepass") + 1] == "$(VALKEY_PASSWORD)"):
        p.append(f"args {args}")
    if secret_ref(vc, "VALKEY_PASSWORD") != ("fairway-api-keys", clu.get("password_env")):
        p.append(f"VALKEY_PASSWORD from {secret_ref(vc, 'VALKEY_PASSWORD')}")
    checks.append(("the store requires the password the gateways send ([cluster] password_env in fairway-api-keys)", p))
    p = []
    if find(docs, "PodDisruptionBudget", sts["metadata"]["name"], m[2]) is None:
        p.append("no PodDisruptionBudget")
    if vc.get("readinessProbe") is None:
        p.append("no readiness probe")
    p += store_pod_security(sts)
    checks.append(("the store has its PodDisruptionBudget and a readiness probe; its pod is restricted and read-only",
                   p))
    return checks


def pods_kept(pdb, replicas):
    """The pods a PodDisruptionBudget keeps out of replicas (percentages
    rounded up, as the disruption controller does)."""
    def scaled(v):
        if isinstance(v, str) and v.endswith("%"):
            return -(-replicas * int(v[:-1]) // 100)
        return int(v)
    spec = pdb["spec"]
    if "minAvailable" in spec:
        return scaled(spec["minAvailable"])
    if "maxUnavailable" in spec:
        return replicas - scaled(spec["maxUnavailable"])
    return 0


def sentinel_store_checks(docs, clu):
    """[cluster] store = redis+sentinel://HOST:PORT,…/NAME against
    components/store-sentinel's StatefulSet: (what, problems) pairs."""
    url = clu.get("store", "")
    m = SENTINEL_STORE.fullmatch(url)
    if not m:
        return [(f"[cluster] store {url}", ["not redis+sentinel://HOST:PORT[,HOST:PORT…]/NAME"])]
    hosts, name = m[1].split(","), m[2]
    parsed = [POD_HOST.fullmatch(h) for h in hosts]
    if not all(parsed):
        return [(f"[cluster] store {url}",
                 [f"{h}: not a StatefulSet pod's name (SET-N.SERVICE[.NAMESPACE.svc.cluster.local]:PORT)"
                  for h, x in zip(hosts, parsed) if not x])]
    if len({(x[1], x[3], x[4], x[5]) for x in parsed}) != 1:
        return [(f"[cluster] store {url}", ["the sentinels are not the pods of one StatefulSet on one port"])]
    set_name, svc_name, ns, port = parsed[0][1], parsed[0][3], parsed[0][4] or "fairway", int(parsed[0][5])
    sts, svc = find(docs, "StatefulSet", set_name, ns), find(docs, "Service", svc_name, ns)
    if not sts:
        return [(f"[cluster] store {url}", [f"no StatefulSet {ns}/{set_name}"])]
    spec, pod = sts["spec"], sts["spec"]["template"]["spec"]
    replicas = spec.get("replicas", 1)
    labels = sts["spec"]["template"]["metadata"]["labels"]
    vc, sc = container(sts, "valkey"), container(sts, "sentinel")
    if not (vc and sc):
        return [(f"StatefulSet {ns}/{set_name}", ["no containers valkey and sentinel"])]
    checks = []

    # The hosts: every pod's sentinel by its DNS name, through the headless
    # governing Service.
    p = []
    if spec.get("serviceName") != svc_name:
        p.append(f"the pods' names are under Service {spec.get('serviceName')}, not {svc_name}")
    if [int(x[2]) for x in parsed] != list(range(replicas)):
        p.append(f"sentinels of pods {[int(x[2]) for x in parsed]}, the StatefulSet has pods 0..{replicas - 1}")
    if svc is None:
        p.append(f"no Service {ns}/{svc_name}")
    else:
        s = svc["spec"]
        if s.get("clusterIP") != "None":
            p.append("the Service is not headless (clusterIP: None): the pods have no DNS names")
        if s.get("publishNotReadyAddresses") is not True:
            p.append("the Service publishes ready pods only: the pods need each other's names to become ready")
        if not all(labels.get(k) == v for k, v in s.get("selector", {}).items()):
            p.append("the Service does not select the StatefulSet's pods")
        for cname, c in (("sentinel", sc), ("valkey", vc)):
            cport = named_port(c, cname)
            want = port if cname == "sentinel" else 6379
            sp = next((x for x in s["ports"] if x["port"] == want), None)
            if cport != want:
                p.append(f"container {cname}'s port {cname} is {cport}, not {want}")
            if sp is None or sp.get("targetPort") not in (cname, cport):
                p.append(f"the Service has no port {want} to the {cname} container")
    checks.append((f"[cluster] store: the sentinels of all {len(hosts)} pods of {set_name}, "
                   f"by the headless Service's names, port {port}", p))

    # The settings: the primary's name, a majority quorum, the pods
    # store.sh asks.
    p = []
    refs = [[e["configMapRef"]["name"] for e in c.get("envFrom", []) if "configMapRef" in e] for c in (vc, sc)]
    cm = find(docs, "ConfigMap", refs[0][0], ns) if refs[0] and refs[0] == refs[1] else None
    env = (cm or {}).get("data", {})
    if cm is None:
        p.append(f"the containers do not take one ConfigMap of settings: envFrom {refs}")
    if env.get("SENTINEL_PRIMARY_NAME") != name:
        p.append(f"the sentinels monitor {env.get('SENTINEL_PRIMARY_NAME')!r}, the store URL names {name!r}")
    if env.get("STORE_SERVICE") != spec.get("serviceName") or env.get("STORE_REPLICAS") != str(replicas):
        p.append(f"store.sh asks {env.get('STORE_REPLICAS')} pods under {env.get('STORE_SERVICE')}, "
                 f"the StatefulSet has {replicas} under {spec.get('serviceName')}")
    if env.get("CLUSTER_DOMAIN") != "cluster.local":
        p.append(f"CLUSTER_DOMAIN {env.get('CLUSTER_DOMAIN')}, the store URL's names end in cluster.local")
    try:
        quorum = int(env.get("SENTINEL_QUORUM", ""))
    except ValueError:
        quorum = 0
    if replicas < 3 or replicas % 2 == 0:
        p.append(f"{replicas} sentinels: needs an odd number, 3 or more, so that a majority outlives one")
    if not replicas // 2 < quorum <= replicas:
        p.append(f"quorum {env.get('SENTINEL_QUORUM')}: not a majority of {replicas}")
    for k in ("SENTINEL_DOWN_AFTER_MS", "SENTINEL_FAILOVER_TIMEOUT_MS"):
        if not str(env.get(k, "")).isdigit() or int(env[k]) == 0:
            p.append(f"{k} {env.get(k)!r}: not a positive number of milliseconds")
    for c in (vc, sc):
        got = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c.get("env", [])}
        if got.get("POD_NAME") != "metadata.name" or got.get("POD_NAMESPACE") != "metadata.namespace":
            p.append(f"container {c['name']}: POD_NAME, POD_NAMESPACE not from the downward API")
    checks.append((f"the sentinels monitor {name!r} (the store URL's), quorum a majority, the StatefulSet's pods", p))

    # store.sh starts both, with a writable directory for their files.
    p = []
    script_text = (KDIR / SENTINEL_SCRIPT).read_text()
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    script_cms = {name: find(docs, "ConfigMap", v["configMap"]["name"], ns)
                  for name, v in volumes.items() if "configMap" in v}
    scripts = next((name for name, cm in script_cms.items() if "store.sh" in (cm or {}).get("data", {})), None)
    conf_dir = re.search(r"^CONF_DIR=\$\{CONF_DIR:-(\S+)\}$", script_text, re.M)
    consts = dict(re.findall(r"^(VALKEY_PORT|SENTINEL_PORT)=([0-9]+)$", script_text, re.M))
    if scripts is None:
        p.append("no ConfigMap with store.sh among the pod's volumes")
    else:
        text = script_cms[scripts]["data"]["store.sh"]
        if text != script_text:
            p.append(f"the ConfigMap's store.sh is not {SENTINEL_SCRIPT}")
        sh = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True)
        if sh.returncode != 0:
            p.append(f"store.sh: sh -n: {sh.stderr.strip()}")
    for c, args in ((vc, "valkey-server"), (sc, "valkey-sentinel")):
        mounts = c.get("volumeMounts", [])
        path = next((x["mountPath"] for x in mounts if x["name"] == scripts), None)
        if c.get("command") != ["/bin/sh", f"{path}/store.sh"] or (c.get("args") or [None])[0] != args:
            p.append(f"container {c['name']}: {c.get('command')} {c.get('args')}, not /bin/sh {path}/store.sh {args}")
        if not any(conf_dir and x["mountPath"] == conf_dir[1] and not x.get("readOnly")
                   and "emptyDir" in volumes.get(x["name"], {}) for x in mounts):
            p.append(f"container {c['name']}: no writable emptyDir at store.sh's CONF_DIR "
                     f"{conf_dir and conf_dir[1]} (the sentinel rewrites its file)")
        if c.get("image") != vc.get("image"):
            p.append(f"container {c['name']}: image {c.get('image')}, the server's is {vc.get('image')}")
    if consts != {"VALKEY_PORT": "6379", "SENTINEL_PORT": str(port)}:
        p.append(f"store.sh's ports {consts}, the containers' 6379 and {port}")
    checks.append((f"both containers start through {SENTINEL_SCRIPT} (the ConfigMap's, valid sh), "
                   "with a writable emptyDir for their files", p))

    # The password the gateways send to the sentinels and to the primary.
    p = []
    for c in (vc, sc):
        if secret_ref(c, "VALKEY_PASSWORD") != ("fairway-api-keys", clu.get("password_env")):
            p.append(f"container {c['name']}: VALKEY_PASSWORD from {secret_ref(c, 'VALKEY_PASSWORD')}")
    for needle in ('requirepass $(quoted "$VALKEY_PASSWORD")', 'masterauth $(quoted "$VALKEY_PASSWORD")',
                   'sentinel auth-pass $SENTINEL_PRIMARY_NAME $(quoted "$VALKEY_PASSWORD")'):
        if needle not in script_text:
            p.append(f"store.sh does not write {needle!r}")
    checks.append(("the servers and sentinels require, and use with each other, the password the gateways send "
                   "([cluster] password_env in fairway-api-keys)", p))

    # One node's loss leaves a majority and a replica: one pod per node, a
    # budget keeping the majority, readiness.
    p = []
    aff = pod.get("affinity", {}).get("podAntiAffinity", {})
    if not any(t.get("topologyKey") == "kubernetes.io/hostname"
               and selector_matches(t.get("labelSelector"), labels)
               for t in aff.get("requiredDuringSchedulingIgnoredDuringExecution", [])):
        p.append("no required pod anti-affinity on kubernetes.io/hostname: two pods may share a node")
    pdb = next((d for d in docs if d.get("kind") == "PodDisruptionBudget" and d["metadata"].get("namespace") == ns
                and selector_matches(d["spec"].get("selector"), labels)), None)
    if pdb is None:
        p.append("no PodDisruptionBudget")
    elif pods_kept(pdb, replicas) < replicas // 2 + 1:
        p.append(f"the PodDisruptionBudget keeps {pods_kept(pdb, replicas)} of {replicas} pods, "
                 f"not a majority ({replicas // 2 + 1})")
    for c in (vc, sc):
        if c.get("readinessProbe") is None:
            p.append(f"container {c['name']}: no readiness probe")
    p += store_pod_security(sts)
    checks.append(("one store pod per node, a PodDisruptionBudget keeping a majority, readiness probes; "
                   "the pod restricted and read-only", p))
    return checks


def store_checks(docs, clu):
    if clu.get("store", "").startswith("redis+sentinel://"):
        return sentinel_store_checks(docs, clu)
    return plain_store_checks(docs, clu)


def check_store(base_docs, all_docs):
    """The store each render runs is the one its policy names: the base's
    single Valkey (or, with components/store-sentinel listed in
    kustomization.yaml, the sentinels), and the render with every component,
    components/store-sentinel's."""
    print("store")
    original = (KDIR / "config/fairway.toml").read_text()
    sentinel_copy = (KDIR / SENTINEL_POLICY).read_text()
    problems = policy_copy_problems(sentinel_copy, original)
    R.check(not problems, f"{SENTINEL_POLICY} is config/fairway.toml but for [cluster] store", "; ".join(problems))
    for label, edit in {
        "[server] drain_timeout changed too": lambda t: t.replace('drain_timeout = "60s"', 'drain_timeout = "30s"'),
        "a line added": lambda t: t + "# more\n",
        "the store line left as config/fairway.toml's": lambda t: original,
    }.items():
        R.check(bool(policy_copy_problems(edit(sentinel_copy), original)),
                f"negative: a {SENTINEL_POLICY} with {label} is refused", "accepted")

    listed = [c.rstrip("/") for c in yaml.safe_load(open(KDIR / "kustomization.yaml")).get("components") or []]
    renders = (("the base", base_docs, SENTINEL_POLICY if SENTINEL_COMPONENT in listed else "config/fairway.toml"),
               ("with every component", all_docs, SENTINEL_POLICY))
    sentinel_render = None
    for label, docs, expected in renders:
        cm = find(docs, "ConfigMap", "fairway-policy", "fairway")
        text = (cm or {}).get("data", {}).get("fairway.toml", "")
        if not R.check(text == (KDIR / expected).read_text(),
                       f"{label}: ConfigMap fairway-policy's fairway.toml is {expected}", "differs"):
            continue
        clu = tomllib.loads(text).get("cluster")
        if not clu:
            continue
        for what, problems in store_checks(docs, clu):
            R.check(not problems, f"{label}: {what}", "; ".join(problems))
        if expected == SENTINEL_POLICY:
            sentinel_render = (docs, clu)

    # Broken variants of the sentinel store, each refused.
    if sentinel_render is None:
        R.fail("negative: broken sentinel stores are refused", f"no render with {SENTINEL_POLICY} to break")
        return
    docs, clu = sentinel_render
    ns = "fairway"
    fourth = "fairway-store-3.fairway-store.fairway.svc.cluster.local:26379"

    def sts(d):
        return find(d, "StatefulSet", "fairway-store", ns)

    def pod(d):
        return sts(d)["spec"]["template"]["spec"]

    def sentinel(d):
        return container(sts(d), "sentinel")

    def by_name(items, name):
        return next(x for x in items if x["name"] == name)

    def settings(d):
        return find(d, "ConfigMap", sentinel(d)["envFrom"][0]["configMapRef"]["name"], ns)["data"]

    def svc_spec(d):
        return find(d, "Service", "fairway-store", ns)["spec"]

    def pdb_spec(d):
        return find(d, "PodDisruptionBudget", "fairway-store", ns)["spec"]

    def url(f):
        def edit(d, c):
            c["store"] = f(c["store"])
        return edit

    def on(fn):
        def edit(d, c):
            fn(d)
        return edit

    def four_pods(d, c):
        sts(d)["spec"]["replicas"] = 4
        settings(d)["STORE_REPLICAS"] = "4"
        c["store"] = re.sub(r"/fairway$", f",{fourth}/fairway", c["store"])

    def min_available_1(d):
        pdb_spec(d).pop("maxUnavailable")
        pdb_spec(d)["minAvailable"] = 1

    for label, fn in {
        "a store URL naming two sentinels of three pods": url(lambda u: re.sub(r",[^,]*(/[^/]+)$", r"\1", u)),
        "a primary name the sentinels do not monitor": url(lambda u: u.rsplit("/", 1)[0] + "/mymaster"),
        "the sentinels' port as 26380": url(lambda u: u.replace(":26379", ":26380")),
        "the sentinels of another StatefulSet's pods": url(lambda u: u.replace("fairway-store-", "fairway-cache-")),
        "five pods, the URL and STORE_REPLICAS left at three": on(lambda d: sts(d)["spec"].update(replicas=5)),
        "four pods and sentinels": four_pods,
        "a Service that is not headless": on(lambda d: svc_spec(d).pop("clusterIP")),
        "a Service publishing ready pods only": on(lambda d: svc_spec(d).pop("publishNotReadyAddresses")),
        "no Service port 26379": on(lambda d: svc_spec(d).update(
            ports=[x for x in svc_spec(d)["ports"] if x["port"] != 26379])),
        "the sentinel's password from another Secret key": on(lambda d: by_name(sentinel(d)["env"], "VALKEY_PASSWORD")
                                                              ["valueFrom"]["secretKeyRef"].update(key="ACME_API_KEY")),
        "quorum 1": on(lambda d: settings(d).update(SENTINEL_QUORUM="1")),
        "a PodDisruptionBudget allowing two pods down": on(lambda d: pdb_spec(d).update(maxUnavailable=2)),
        "a PodDisruptionBudget of minAvailable 1": on(min_available_1),
        "a PodDisruptionBudget of maxUnavailable 50%": on(lambda d: pdb_spec(d).update(maxUnavailable="50%")),
        "preferred anti-affinity only": on(lambda d: pod(d)["affinity"]["podAntiAffinity"]
                                           .pop("requiredDuringSchedulingIgnoredDuringExecution")),
        "no sentinel container": on(lambda d: pod(d).update(
            containers=[x for x in pod(d)["containers"] if x["name"] != "sentinel"])),
        "the sentinel's files on a read-only mount": on(lambda d: by_name(sentinel(d)["volumeMounts"], "conf")
                                                        .update(readOnly=True)),
        "a sentinel running as root": on(lambda d: sentinel(d)["securityContext"].update(runAsNonRoot=False,
                                                                                          runAsUser=0)),
    }.items():
        d, c = copy.deepcopy(docs), copy.deepcopy(clu)
        fn(d, c)
        R.check(any(p for _, p in store_checks(d, c)), f"negative: a sentinel store with {label} is refused",
                "accepted")
    # The base's plain URL with the component's three pods: a call could reach a replica.
    plain = tomllib.loads(original)["cluster"]
    R.check(any(p for _, p in store_checks(docs, plain)),
            "negative: config/fairway.toml's redis:// store with the component's three pods is refused", "accepted")


# ---------------------------------------------------------------- main

def main():
    render_base, render_all, third_party_out = sys.argv[1:4]
    docs = []                       # (source, doc)
    base_docs = load_docs(render_base)
    all_docs = load_docs(render_all)
    base_names = {name_of(d) for d in base_docs}
    all_names = {name_of(d) for d in all_docs}
    print("render")
    R.check(base_names <= all_names, "the components only add to the base", f"lost {base_names - all_names}")
    for d in all_docs:
        docs.append(("kustomize build", d))
    for p in sorted(KDIR.glob("examples/*.yaml")) + [KDIR / "secret-api-keys.example.yaml"]:
        for d in load_docs(p):
            docs.append((rel(p).removeprefix("deploy/kubernetes/"), d))
    for d in load_docs(KDIR / "config/tenants.yaml"):
        docs.append(("config/tenants.yaml", d))

    check_files()

    print("k8s (kubernetes-validate %s; Kubernetes %s)" % (kubernetes_validate.__version__, ", ".join(K8S_VERSIONS)))
    third_party, tba, kueue = [], [], []
    for source, d in docs:
        if d.get("kind") == "TokenBucketAdmission":
            tba.append((source, d))
        elif group_of(d) == KUEUE_GROUP:
            kueue.append((source, d))
        elif group_of(d) in THIRD_PARTY_GROUPS:
            third_party.append({"source": source, "doc": d})
        else:
            validate_builtin(d, source)
    # The negative case: strict validation refuses an unknown field.
    gw = copy.deepcopy(find(all_docs, "Deployment", "fairway-gateway"))
    gw["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGets"] = {}
    try:
        kubernetes_validate.validate(gw, K8S_VERSIONS[0], strict=True)
        R.fail("negative: a Deployment with an unknown field is refused", "accepted")
    except kubernetes_validate.ValidationError:
        R.ok("negative: a Deployment with an unknown field is refused")

    crd = find(all_docs, "CustomResourceDefinition", "tokenbucketadmissions.slo.fairway.dev")
    check_crd(crd, tba)
    cfg_sched = check_scheduler(KDIR / "scheduler/kube-scheduler-config.yaml")
    flat = []
    for source, d in docs:
        d = dict(d)
        d["_source"] = source
        flat.append(d)
    check_kueue(kueue, flat)
    check_consistency(flat, cfg_sched)
    check_store(base_docs, all_docs)

    with open(third_party_out, "w") as f:
        json.dump(third_party, f, indent=1)
    print(f"check.py: {R.passed} passed, {len(R.failures)} failed")
    return 1 if R.failures else 0


if __name__ == "__main__":
    sys.exit(main())
