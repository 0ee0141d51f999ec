// Package planestatus gathers what an operator asks first about the quota
// planes of a cluster: which policy version each plane published, how far
// the enforcer fleet has rolled it out, and which enforcers run degraded.
// `quotactl status` prints it.
//
// Its sources are the ones the manager itself reads: Redis (pkg/store: the
// published versions and the enforcers' heartbeat reports, which lapse when
// an enforcer stops renewing them) and, when asked, the Kubernetes API (the
// QuotaPlanes' status: the version the manager last published, its Ready
// and Enforced conditions, the objects it rejected or holds). A plane
// found in only one of them is listed with what that one says.
package planestatus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/report"
	"github.com/quotaplane/quotaplane/pkg/store"
)

// Plane is one plane's status.
type Plane struct {
	Plane string `json:"plane"`
	// From Redis: the published versions and the fleet's reports.
	Version   int64      `json:"version,omitempty"`
	Hash      string     `json:"hash,omitempty"`
	Kept      []int64    `json:"keptVersions,omitempty"`
	Mode      string     `json:"mode,omitempty"`
	Enforcers []Enforcer `json:"enforcers"`
	// OnCurrent counts the enforcers that report the current version.
	OnCurrent int `json:"onCurrent"`
	// Degraded counts the enforcers that report running degraded.
	Degraded int `json:"degraded"`
	// Rollout says in words how far the current version has gone.
	Rollout string `json:"rollout"`
	// Kubernetes is the QuotaPlane's status, when read.
	Kubernetes *Kubernetes `json:"kubernetes,omitempty"`
	// Errors are what could not be read for this plane.
	Errors []string `json:"errors,omitempty"`

	redis bool // read from Redis
}

// Enforcer is one enforcer's live report.
type Enforcer struct {
	ID              string    `json:"id"`
	PolicyVersion   int64     `json:"policyVersion"`
	Mode            string    `json:"mode,omitempty"`
	Degraded        bool      `json:"degraded"`
	DecisionsPerSec float64   `json:"decisionsPerSecond"`
	ReportUntil     time.Time `json:"reportUntil"`
}

// Kubernetes is what the QuotaPlane's status says.
type Kubernetes struct {
	PublishedVersion int64  `json:"publishedVersion"`
	Ready            string `json:"ready"`
	ReadyReason      string `json:"readyReason,omitempty"`
	ReadyMessage     string `json:"readyMessage,omitempty"`
	Enforced         string `json:"enforced"`
	EnforcedMessage  string `json:"enforcedMessage,omitempty"`
	EnforcersReady   int32  `json:"enforcersReady"`
	Enforcers        int32  `json:"enforcers"`
	Replicas         int32  `json:"replicas"`
	RejectedObjects  int32  `json:"rejectedObjects"`
	HeldObjects      int32  `json:"heldObjects"`
}

// Status is every plane's status.
type Status struct {
	Planes []Plane `json:"planes"`
}

// FromRedis reads the status of planes (every plane with a policy in c
// when empty) from Redis.
func FromRedis(ctx context.Context, c redis.UniversalClient, planes []string) (*Status, error) {
	if len(planes) == 0 {
		var err error
		if planes, err = store.Planes(ctx, c); err != nil {
			return nil, err
		}
	}
	st := &Status{Planes: []Plane{}}
	for _, name := range planes {
		s, err := store.New(c, name)
		if err != nil {
			return nil, err
		}
		p := Plane{Plane: name, Enforcers: []Enforcer{}, redis: true}
		versions, err := s.Versions(ctx)
		switch {
		case errors.Is(err, store.ErrNoPolicy):
			p.Errors = append(p.Errors, "no policy published in Redis")
		case err != nil:
			p.Errors = append(p.Errors, err.Error())
		default:
			p.Version, p.Hash, p.Kept = versions.Current, versions.Hash, versions.Kept
			if pol, err := s.Current(ctx); err != nil {
				p.Errors = append(p.Errors, err.Error())
			} else {
				p.Mode = pol.Spec().Mode
			}
		}
		reports, err := s.Enforcers(ctx)
		if err != nil {
			p.Errors = append(p.Errors, err.Error())
		}
		for _, r := range reports {
			p.Enforcers = append(p.Enforcers, Enforcer{ID: r.ID, PolicyVersion: r.PolicyVersion, Mode: r.Mode, Degraded: r.Degraded,
				DecisionsPerSec: r.DecisionsPerSec, ReportUntil: r.Until})
		}
		p.settle()
		st.Planes = append(st.Planes, p)
	}
	return st, nil
}

// settle counts the fleet against the current version.
func (p *Plane) settle() {
	p.OnCurrent, p.Degraded = 0, 0
	for _, e := range p.Enforcers {
		if e.PolicyVersion == p.Version && p.Version > 0 {
			p.OnCurrent++
		}
		if e.Degraded {
			p.Degraded++
		}
	}
	switch {
	case p.Version == 0:
		p.Rollout = "nothing published"
	case len(p.Enforcers) == 0:
		p.Rollout = "no enforcer reports"
	case p.OnCurrent == len(p.Enforcers):
		p.Rollout = fmt.Sprintf("complete: all %d on v%d", len(p.Enforcers), p.Version)
	default:
		byVersion := map[int64]int{}
		for _, e := range p.Enforcers {
			byVersion[e.PolicyVersion]++
		}
		var parts []string
		for _, v := range slices.Sorted(maps.Keys(byVersion)) {
			parts = append(parts, fmt.Sprintf("%d on v%d", byVersion[v], v))
		}
		p.Rollout = fmt.Sprintf("in progress: %d of %d on v%d (%s)", p.OnCurrent, len(p.Enforcers), p.Version, strings.Join(parts, ", "))
	}
}

// AddKubernetes reads the QuotaPlanes in namespace (every namespace when
// empty) through c and adds their status to st: to the plane of the same
// namespace/name, or as a plane of its own when Redis has none. When st
// names planes (a --plane filter), only those are read.
func (st *Status) AddKubernetes(ctx context.Context, c client.Reader, namespace string, only []string) error {
	var list v1alpha1.QuotaPlaneList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return fmt.Errorf("list QuotaPlanes: %w", err)
	}
	for _, qp := range list.Items {
		name := qp.Namespace + "/" + qp.Name
		if len(only) > 0 && !slices.Contains(only, name) {
			continue
		}
		k := &Kubernetes{PublishedVersion: qp.Status.PublishedVersion, EnforcersReady: qp.Status.EnforcersReady, Enforcers: qp.Status.Enforcers,
			Replicas: qp.Status.Replicas, RejectedObjects: qp.Status.RejectedObjects, HeldObjects: qp.Status.HeldObjects, Ready: "Unknown", Enforced: "Unknown"}
		if c := meta.FindStatusCondition(qp.Status.Conditions, v1alpha1.ConditionReady); c != nil {
			k.Ready, k.ReadyReason, k.ReadyMessage = string(c.Status), c.Reason, c.Message
		}
		if c := meta.FindStatusCondition(qp.Status.Conditions, v1alpha1.ConditionEnforced); c != nil {
			k.Enforced, k.EnforcedMessage = string(c.Status), c.Message
		}
		i := slices.IndexFunc(st.Planes, func(p Plane) bool { return p.Plane == name })
		if i < 0 {
			st.Planes = append(st.Planes, Plane{Plane: name, Enforcers: []Enforcer{}, Rollout: "not in Redis"})
			i = len(st.Planes) - 1
		}
		st.Planes[i].Kubernetes = k
	}
	slices.SortFunc(st.Planes, func(a, b Plane) int { return strings.Compare(a.Plane, b.Plane) })
	return nil
}

// Unhealthy says whether some plane read from Redis has nothing published,
// no enforcer reporting, a rollout in progress or a degraded enforcer, or
// whether a read failed or a QuotaPlane is not Ready.
func (st *Status) Unhealthy() bool {
	for _, p := range st.Planes {
		fleet := p.redis && (p.Version == 0 || len(p.Enforcers) == 0 || p.OnCurrent < len(p.Enforcers) || p.Degraded > 0)
		if fleet || len(p.Errors) > 0 || (p.Kubernetes != nil && p.Kubernetes.Ready != "True") {
			return true
		}
	}
	return false
}

// Tables are the planes, their enforcers, and what could not be read.
func (st *Status) Tables() []report.Table {
	planes := report.Table{Title: "planes", Header: []string{"PLANE", "VERSION", "HASH", "KEPT", "MODE", "ENFORCERS", "ON CURRENT", "DEGRADED", "ROLLOUT"}}
	kube := report.Table{Title: "QuotaPlanes (Kubernetes)", Header: []string{"PLANE", "READY", "REASON", "ENFORCED", "PUBLISHED", "ENFORCERS READY", "REPLICAS", "REJECTED", "HELD", "MESSAGE"}}
	fleet := report.Table{Title: "enforcers", Header: []string{"PLANE", "ENFORCER", "VERSION", "MODE", "DEGRADED", "DECISIONS/s", "REPORT UNTIL"}}
	var problems report.Table
	for _, p := range st.Planes {
		var kept []string
		for _, v := range p.Kept {
			kept = append(kept, strconv.FormatInt(v, 10))
		}
		version := "-"
		if p.Version > 0 {
			version = "v" + strconv.FormatInt(p.Version, 10)
		}
		planes.Rows = append(planes.Rows, []string{p.Plane, version, cmp.Or(p.Hash[:min(12, len(p.Hash))], "-"), cmp.Or(strings.Join(kept, ","), "-"),
			cmp.Or(p.Mode, "-"), strconv.Itoa(len(p.Enforcers)), strconv.Itoa(p.OnCurrent), strconv.Itoa(p.Degraded), p.Rollout})
		if k := p.Kubernetes; k != nil {
			kube.Rows = append(kube.Rows, []string{p.Plane, k.Ready, cmp.Or(k.ReadyReason, "-"), k.Enforced, "v" + strconv.FormatInt(k.PublishedVersion, 10),
				fmt.Sprintf("%d/%d", k.EnforcersReady, k.Enforcers), strconv.Itoa(int(k.Replicas)), strconv.Itoa(int(k.RejectedObjects)), strconv.Itoa(int(k.HeldObjects)),
				cmp.Or(k.ReadyMessage, "-")})
		}
		for _, e := range p.Enforcers {
			fleet.Rows = append(fleet.Rows, []string{p.Plane, e.ID, "v" + strconv.FormatInt(e.PolicyVersion, 10), cmp.Or(e.Mode, "?"),
				strconv.FormatBool(e.Degraded), fmt.Sprintf("%.0f", e.DecisionsPerSec), e.ReportUntil.UTC().Format(time.RFC3339)})
		}
		for _, err := range p.Errors {
			problems.Notes = append(problems.Notes, p.Plane+": "+err)
		}
	}
	if len(st.Planes) == 0 {
		return []report.Table{{Title: "planes", Notes: []string{"no plane has a policy in this Redis"}}}
	}
	tables := []report.Table{planes}
	if len(kube.Rows) > 0 {
		tables = append(tables, kube)
	}
	if len(fleet.Rows) > 0 {
		tables = append(tables, fleet)
	}
	if len(problems.Notes) > 0 {
		problems.Title = "could not read"
		tables = append(tables, problems)
	}
	return tables
}
