package whatif

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/pkg/load"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// ProfileSeed002 names seed 002's profile (load.Seed002) in -profile.
const ProfileSeed002 = "seed002"

// maxProfileTenants bounds the tenants of a profile file.
const maxProfileTenants = 1_000_000

// LoadProfile builds the profile named by name: ProfileSeed002, or a CSV
// file of tenants (ReadProfile) offered seed 002's endpoint mix and api
// keys per tenant. duration and seed, when not zero, replace the profile's.
func LoadProfile(name string, duration time.Duration, seed uint64) (*load.Built, string, error) {
	p := load.Seed002()
	if duration != 0 {
		p.Duration = duration
	}
	if seed != 0 {
		p.Seed = seed
	}
	if name == ProfileSeed002 {
		b, err := p.Build()
		return b, "seed 002's profile (100,000 req/s, 5,000 tenants)", err
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, "", fmt.Errorf("-profile: %w (give %s or a CSV file of tenants)", err, ProfileSeed002)
	}
	defer f.Close()
	tenants, err := ReadProfile(f)
	if err != nil {
		return nil, "", fmt.Errorf("-profile %s: %w", name, err)
	}
	b, err := p.BuildTenants(tenants)
	if err != nil {
		return nil, "", fmt.Errorf("-profile %s: %w", name, err)
	}
	return b, fmt.Sprintf("profile %s (%.0f req/s, %d tenants)", name, b.Rate, len(b.Tenants)), nil
}

// ReadProfile reads a profile file: CSV with a header row naming the
// columns tenant, rate (requests per second) and, optionally, tier (sent
// with the tenant's requests: the tier of a tenant the plane does not
// name; empty means the plane's default tier). A tenants.csv written by
// `load -out DIR` reads too: without a rate column, its offered_per_s is
// the rate. Lines starting with # are comments.
func ReadProfile(r io.Reader) ([]load.TenantRate, error) {
	cr := csv.NewReader(r)
	cr.Comment = '#'
	cr.FieldsPerRecord = -1
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, errors.New("empty: want a header row such as tenant,tier,rate")
	}
	if err != nil {
		return nil, err
	}
	for i := range header {
		header[i] = strings.TrimSpace(header[i])
	}
	tenantCol, tierCol, rateCol := slices.Index(header, "tenant"), slices.Index(header, "tier"), slices.Index(header, "rate")
	if rateCol < 0 {
		rateCol = slices.Index(header, "offered_per_s")
	}
	if tenantCol < 0 || rateCol < 0 {
		return nil, fmt.Errorf("header %q: want the columns tenant and rate (and optionally tier)", strings.Join(header, ","))
	}
	var tenants []load.TenantRate
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		line, _ := cr.FieldPos(0)
		if len(rec) != len(header) {
			return nil, fmt.Errorf("line %d: %d fields, the header has %d", line, len(rec), len(header))
		}
		rate, err := strconv.ParseFloat(strings.TrimSpace(rec[rateCol]), 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: rate %q: not a number", line, rec[rateCol])
		}
		t := load.TenantRate{Name: strings.TrimSpace(rec[tenantCol]), Rate: rate}
		if !policy.ValidName(t.Name) {
			return nil, fmt.Errorf("line %d: tenant %q: a name is 1 to %d printable ASCII characters without spaces", line, t.Name, policy.MaxNameBytes)
		}
		if tierCol >= 0 {
			t.Tier = strings.TrimSpace(rec[tierCol])
		}
		if len(tenants) == maxProfileTenants {
			return nil, fmt.Errorf("more than %d tenants", maxProfileTenants)
		}
		tenants = append(tenants, t)
	}
	if len(tenants) == 0 {
		return nil, errors.New("no tenants under the header")
	}
	return tenants, nil
}
