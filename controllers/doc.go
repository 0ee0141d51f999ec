// Package controllers is the quotaplane manager: it turns the quota objects of
// each namespace into a versioned policy in the Redis policy store, reports
// on every object whether it is in force, scales the enforcer fleet, and
// senses each plane's Upstreams (see Upstreams).
//
// # Shape
//
// A plane is a namespace: its QuotaPlane and every TenantQuota, EndpointQuota
// and BurstPool beside it. Two kinds of controllers share the work.
//
//   - The compiler (one per manager) keeps one queue key per namespace. Any
//     change to any quota object of the namespace enqueues that key; a
//     reconcile re-lists every object of the namespace from the cache, runs
//     policy.Compile and publishes the result with store.Publish, which stores
//     a new version only when the compiled content changed. It is level-based:
//     it never looks at what kind of event woke it, so a missed, merged or
//     repeated event changes nothing. It writes no status: it records its
//     verdict (what was compiled, at which generation, which problems, which
//     version is published) and pokes the status controllers of the objects
//     it compiled.
//   - One status controller per kind owns that kind's status. It reads the
//     compiler's verdict for its object and writes Ready, policyVersion and
//     observedGeneration once per reconcile, only when they changed. When the
//     verdict is for an older generation of the object, it writes nothing: a
//     compile of the new generation is already queued and will poke it again.
//     The QuotaPlane's controller also counts the enforcers that report the
//     published version (from their Redis heartbeats) and scales the enforcer
//     Deployment through its scale subresource (see fleet.go).
//
// # What reaches the enforcers
//
// No edit silently lowers a limit. An object is in force when the published
// version was compiled from it; the compiler remembers the spec of each
// object in force (uid, generation, spec). When an edit of such an object
// does not compile, the last valid spec is compiled in its place: the
// object is held, its Ready condition is False with reason Held, says what
// is wrong and that "the last valid version (generation N) stays in force
// until this is fixed". A typo in a tenant's tier no longer drops the
// tenant to the default tier. An object that was never in force (new, or
// deleted and created again: another uid) is left out, Ready=False reason
// Invalid, as before.
//
// A QuotaPlane edit that would orphan objects in force (a tier renamed or
// removed that tenants, endpoints or the burst pool use; shards lowered
// below a tenant's) is refused, not half-applied: the plane's last valid
// spec stays in force, its Ready condition (reason Held) names each object
// to change first and why, and once they fit the new spec (each one is held
// meanwhile if it names what only the new spec has) the edit goes through.
// The other choice, keeping those tenants on a tier the plane no longer
// defines, would publish a policy no object describes. An invalid
// QuotaPlane edit is held too, so it does not freeze the other objects'
// edits.
//
// The specs in force survive a manager restart: each publish stores them in
// Redis beside the version, in the same atomic call (store.WithSources), and
// a manager without a verdict for a namespace reads them back before its
// first compile. If Redis loses its data while no manager runs, they are
// lost with the policy, and an invalid edit is left out at the next compile
// (the Ready condition says Invalid); while a manager runs, it writes them
// back with the plane.
//
// The QuotaPlane's status counts the objects rejected (rejectedObjects) and
// held (heldObjects); kubectl get shows both, and the Reason column of the
// other kinds shows Held or Invalid. A ValidatingAdmissionPolicy
// (config/admission) refuses a TenantQuota whose tier the namespace's
// QuotaPlane does not define before it reaches the compiler.
//
// A namespace holds one plane: its oldest QuotaPlane (by creationTimestamp,
// the name breaking ties) is compiled; any other is not, and says so (Ready
// False, reason Duplicate, naming the one in force), so a stray second
// QuotaPlane no longer freezes the plane. A problem with the plane as a
// whole that cannot be held (no QuotaPlane, an invalid plane never in
// force) compiles to nothing: the last good version stays published and
// every object says so. Deleting an object removes it from the next
// version. Deleting the QuotaPlane leaves the last version in Redis, so
// enforcers keep enforcing it; that is deliberate (a missing plane must not
// lift every limit).
//
// Objects applied together (kubectl apply -f of a directory) arrive one by
// one, so the compiler may publish a few intermediate versions on the way;
// each is a consistent compile of the objects that existed at that moment.
// It does not wait to batch them: an edit reaches the enforcers in tens of
// milliseconds (test/e2e measures it).
//
// A reconcile that fails (Redis away) is retried with backoff capped at
// maxRetryDelay, and the objects say PublishFailed meanwhile. A reconcile
// that succeeds comes back after Options.Resync (10 s) whatever happens, and
// publishes again if Redis no longer holds the content: a Redis restarted
// without persistence gets its planes back. Versions only grow: every
// publish names a floor (store.Above), the higher of the last version this
// process published and the QuotaPlane's status.publishedVersion, so the
// version after a data loss is above both, never 1 again. A manager that
// starts while a plane does not compile reads the version in force from the
// store, so the objects name it and the fleet keeps being scaled for it.
//
// # Status GitOps can trust
//
// Ready=True on the QuotaPlane means valid and published. Enforced means
// the fleet runs it: True when every live enforcer of the plane reports the
// published version loaded (and at least one reports), False with reason
// RollingOut (naming the lagging ones), NoEnforcers or NotPublished, and
// Unknown with reason FleetUnknown while the reports cannot be read (Redis
// away), when enforcersReady is 0 rather than a stale count. All live
// enforcers, not the desired replicas: a pod that starts after a publish
// loads the current version before it reports, so a scale-up does not
// un-enforce the plane, while a pod stuck on an older version does. A report
// lapses when its enforcer stops renewing it. For kstatus (Flux) the plane
// also carries Reconciling and Stalled; config/argocd holds an Argo CD
// health check (docs/gitops.md).
//
// # Enforcer fleet
//
// The QuotaPlane's controller scales the Deployment spec.enforcer names
// (see fleet.go), except that a mode local plane is kept at one replica
// whatever its spec asks: each enforcer of a local plane decides every
// request alone with the whole of every limit, so N replicas behind one
// Service would admit up to N times each limit. The Scaled condition says so
// (reason LocalMode), and by how much the limits are multiplied while more
// than one enforcer still runs the plane. Refusing, rather than only
// warning, makes the unsafe fleet impossible to get by default; per-pod
// limits remain possible without spec.enforcer (the manager then scales
// nothing).
//
// It scales only a Deployment labelled quotaplane.io/enforcer: "true"
// (EnforcerLabel; reason NotAnEnforcer otherwise, nothing scaled), read
// straight from the API server (the manager may get a named Deployment,
// never list or cache them), and never past Options.MaxEnforcerReplicas
// (--max-enforcer-replicas, default 100): the right to create a QuotaPlane
// is not the right to scale the namespace's Deployments.
//
// # Upstreams
//
// Seed 004's pipeline (pkg/upstream) runs in the manager as a runnable
// (upstream.go): every couple of seconds it lists the QuotaPlanes and
// Upstreams from the cache and keeps one upstream.Leader running per
// namespace that has a plane (its primary QuotaPlane, as above) and at
// least one Upstream, each in its own goroutine. The Leader probes,
// folds in the enforcers' passive reports, and each cycle (30 s, 10 s
// below 0.5 confidence) computes every Upstream's confidence, phase and
// every tenant's class and publishes the plan beside the policy, which the
// enforcers apply. Its inputs are the policy in force in Redis, as the
// compiler published it (not the objects in the cache, so an edit that is
// held or rejected does not reach the classes either), and the namespace's
// Upstreams compiled against it with policy.CompileUpstreams, the same
// check Compile and `check` make. A probe header's secretKeyRef is read
// with one get from the API server, never cached.
//
// Each cycle is told back (Leader.Observe):
//
//   - Each Upstream's status: confidence (two decimals), phase, since when
//     (lastTransitionTime), the last probe's time and failure, the named
//     tenants per class, observedGeneration, and Ready: True with reason
//     Sensing (or SensingDisabled), or False with Invalid (it does not
//     compile against the plane: an endpoint the plane lacks or another
//     Upstream already claims, more than 16; the message says what to fix,
//     and it is not sensed), NotSensed (the plane's policy cannot be read)
//     or PublishFailed (Redis did not take the plan). It is patched only
//     when it changed.
//   - Events: ClassChanged on the TenantQuota of each tenant whose class
//     changed (Normal up, Warning down: "class on upstream llm: high →
//     medium (score 0.62, confidence 0.41, Phase1)"), at most 50 a cycle
//     per plane; beyond that one ClassesChanged on the Upstream says how
//     many changed. PhaseChanged on the Upstream when its phase changes
//     (Warning on the way down, Normal on the way back).
//   - The QuotaPlane's spec.outage.webhook, if any: one upstream.Notifier
//     per plane posts each class change as a signed notice; it is built
//     again when the URL or the secret changes (the secret is read each
//     cycle), and sends nothing while its Secret cannot be read (a
//     WebhookUnavailable Event on the QuotaPlane says why).
//   - Metrics, quotaplane_manager_upstream_* (see metrics.go for why not
//     the enforcers' quotaplane_enforcer_upstream_* names), dropped when the leader stops.
//
// A leader stops when its namespace loses its plane or its last Upstream,
// and on shutdown, which waits for them. When the last Upstream of a plane
// is deleted its plan is deleted with it, so the enforcers lift the gate
// at once instead of when the plan expires; when the QuotaPlane is deleted
// the plan is left to expire (PlanTTL), as its policy is left in force.
// The Leader runs on the elected manager only; a manager that takes over
// restores phases, classes and confidence from the plan in Redis.
//
// All controllers run only on the elected leader, so two managers never
// publish or scale at the same time.
package controllers
