// Package controllers is the quotaplane manager: it turns the quota objects of
// each namespace into a versioned policy in the Redis policy store, reports
// on every object whether it is in force, and scales the enforcer fleet.
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
// Compile leaves out every object with a problem, and the object's Ready
// condition says what is wrong and how to fix it. A problem with the plane
// itself (no QuotaPlane, two of them, an invalid tier) compiles to nothing:
// the last good version stays published and every object of the namespace
// says so. Deleting an object removes it from the next version. Deleting the
// QuotaPlane leaves the last version in Redis, so enforcers keep enforcing
// it; that is deliberate (a missing plane must not lift every limit).
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
// without persistence gets its planes back. A manager that starts while a
// plane does not compile reads the version in force from the store, so the
// objects name it and the fleet keeps being scaled for it.
//
// All controllers run only on the elected leader, so two managers never
// publish or scale at the same time.
package controllers
