package config_test

// The trust set-up of docs/security.md in the manifests: the trial Redis's
// ACL users carry pkg/keyspace's rules (the one place they are written),
// its start-up script really defines them (run with the real
// redis-server), and the chart's redis.aclUsers, redis.tls and
// policySigning render what the binaries read, accepted by the real API
// server.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// trialRedis is the trial Redis Deployment of config/redis.
func trialRedis(t *testing.T) *appsv1.Deployment {
	t.Helper()
	f, err := os.Open(filepath.Join(testenv.Root(), "config", "redis", "redis.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	objs, err := decodeAll(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range objs {
		if u.GetKind() == "Deployment" {
			var d appsv1.Deployment
			convert(t, u, &d)
			return &d
		}
	}
	t.Fatal("config/redis/redis.yaml has no Deployment")
	return nil
}

// TestTrialRedisACLRules: the trial Redis's rules are pkg/keyspace's.
func TestTrialRedisACLRules(t *testing.T) {
	d := trialRedis(t)
	for name, want := range map[string]string{
		"MANAGER_ACL":  keyspace.ACLLine(keyspace.ManagerACL("*")),
		"ENFORCER_ACL": keyspace.ACLLine(keyspace.EnforcerACL("*")),
	} {
		if got := envValue(t, d, name); got != want {
			t.Errorf("config/redis/redis.yaml %s is\n%s\nwant pkg/keyspace's\n%s", name, got, want)
		}
	}
}

// TestTrialRedisScript runs the trial Redis container's own script with the
// real redis-server (on a free loopback port: a wrapper adds --port and
// --bind, which win over the script's defaults), the Secret's keys as files
// in a directory (passwords with a space, a quote and a backslash): with
// the three passwords, the default user and both component users log in,
// each with the rules of pkg/keyspace, and the enforcer cannot write the
// policy; without the component passwords there are no component users.
// No password is on the server's command line or in its environment, nor
// in the container's: they reach Redis through the config file the script
// writes, in a memory volume.
func TestTrialRedisScript(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not installed: `make test` installs it: %v", err)
	}
	d := trialRedis(t)
	c := container(t, d)
	if len(c.Command) != 2 || c.Command[0] != "sh" || len(c.Args) != 1 {
		t.Fatalf("the trial Redis runs %q %q, want sh -c SCRIPT", c.Command, c.Args)
	}
	checkTrialRedisSecrets(t, d)
	const adminPassword, managerPassword, enforcerPassword = `admin pw"1\`, `manager "pw\2`, `enforcer\ pw"3`
	for _, withUsers := range []bool{true, false} {
		t.Run(fmt.Sprintf("component users %v", withUsers), func(t *testing.T) {
			dir := t.TempDir()
			secrets := t.TempDir() // the Secret's keys, as the volume mounts them
			files := map[string]string{"password": adminPassword}
			if withUsers {
				files["manager-password"], files["enforcer-password"] = managerPassword, enforcerPassword
			}
			for name, password := range files {
				if err := os.WriteFile(filepath.Join(secrets, name), []byte(password), 0o400); err != nil {
					t.Fatal(err)
				}
			}
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			_, port, _ := net.SplitHostPort(addr)
			l.Close()
			// The wrapper also keeps the arguments and the environment
			// the script starts Redis with (Redis rewrites its own
			// /proc/<pid>/cmdline and environ, so they cannot be read there).
			wrapper := fmt.Sprintf("#!/bin/sh\nprintf '%%s\\n' \"$@\" > %[3]s/argv\nenv > %[3]s/env\nexec %[1]s \"$@\" --port %[2]s --bind 127.0.0.1 --dir %[3]s\n", bin, port, dir)
			if err := os.WriteFile(filepath.Join(dir, "redis-server"), []byte(wrapper), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(c.Command[0], c.Command[1], c.Args[0])
			cmd.Env = []string{"PATH=" + dir + ":/usr/bin:/bin", "REDIS_SECRET_DIR=" + secrets, "REDIS_CONF_DIR=" + dir,
				"MANAGER_ACL=" + envValue(t, d, "MANAGER_ACL"), "ENFORCER_ACL=" + envValue(t, d, "ENFORCER_ACL")}
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

			ctx := context.Background()
			login := func(user, password string) *redis.Client {
				rdb := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: password, DisableIdentity: true})
				t.Cleanup(func() { _ = rdb.Close() })
				return rdb
			}
			admin := login("", adminPassword)
			poll.Until(t, 10*time.Second, "the trial Redis's script starts a server answering on "+addr, func() bool {
				return admin.Ping(ctx).Err() == nil
			})
			for _, what := range []string{"argv", "env"} {
				raw, err := os.ReadFile(filepath.Join(dir, what))
				if err != nil {
					t.Fatal(err)
				}
				if what == "argv" && !strings.Contains(string(raw), "redis.conf") {
					t.Fatalf("the script started Redis with %q, want its config file", raw)
				}
				for _, password := range files {
					if strings.Contains(string(raw), password) {
						t.Errorf("a password is in what the script starts Redis with (%s):\n%s", what, raw)
					}
				}
			}
			users, err := admin.Do(ctx, "ACL", "USERS").StringSlice()
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(users)
			want := []string{"default"}
			if withUsers {
				want = []string{"default", "quotaplane-enforcer", "quotaplane-manager"}
			}
			if !slices.Equal(users, want) {
				t.Fatalf("users %v, want %v", users, want)
			}
			if !withUsers {
				return
			}
			for user, password := range map[string]string{"quotaplane-manager": managerPassword, "quotaplane-enforcer": enforcerPassword} {
				if err := login(user, password).Ping(ctx).Err(); err != nil {
					t.Errorf("%s logs in: %v", user, err)
				}
			}
			// The rules as Redis holds them, compared with a user set with
			// keyspace's rules directly.
			for user, rules := range map[string][]string{"quotaplane-manager": keyspace.ManagerACL("*"), "quotaplane-enforcer": keyspace.EnforcerACL("*")} {
				args := []any{"ACL", "SETUSER", "reference", "reset", "on", "nopass"}
				for _, r := range rules {
					args = append(args, r)
				}
				if err := admin.Do(ctx, args...).Err(); err != nil {
					t.Fatal(err)
				}
				got := aclRules(t, admin, user)
				if !strings.Contains(got, "evalsha") || !strings.Contains(got, "~qp:{*}:policy") {
					t.Fatalf("%s: ACL GETUSER says %q: not the rules", user, got)
				}
				if ref := aclRules(t, admin, "reference"); got != ref {
					t.Errorf("%s has rules\n%s\nwant keyspace's\n%s", user, got, ref)
				}
			}
			err = login("quotaplane-enforcer", enforcerPassword).HSet(ctx, keyspace.Policy("ns/plane"), "current", "9").Err()
			if err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Errorf("the enforcer user wrote the policy: %v", err)
			}
		})
	}
}

// checkTrialRedisSecrets: the trial Redis (d) reads the passwords from the
// Secret quotaplane-redis mounted where REDIS_SECRET_DIR says, and writes
// its config file into a memory volume where REDIS_CONF_DIR says; no
// variable of its container comes from a Secret.
func checkTrialRedisSecrets(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	c := container(t, d)
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			t.Errorf("the trial Redis's variable %s comes from Secret %s: pass passwords as files", e.Name, e.ValueFrom.SecretKeyRef.Name)
		}
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range d.Spec.Template.Spec.Volumes {
		volumes[v.Name] = v
	}
	mounted := func(path string) corev1.Volume {
		for _, vm := range c.VolumeMounts {
			if vm.MountPath == path {
				return volumes[vm.Name]
			}
		}
		t.Errorf("the trial Redis mounts nothing at %s", path)
		return corev1.Volume{}
	}
	if v := mounted(envValue(t, d, "REDIS_SECRET_DIR")); v.Secret == nil || v.Secret.SecretName != "quotaplane-redis" {
		t.Errorf("REDIS_SECRET_DIR is not Secret quotaplane-redis: %+v", v)
	}
	if v := mounted(envValue(t, d, "REDIS_CONF_DIR")); v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory {
		t.Errorf("REDIS_CONF_DIR, where the passwords are written, is not a memory volume: %+v", v)
	}
}

// aclRules are user's commands, keys and channels as ACL GETUSER says.
func aclRules(t *testing.T, admin *redis.Client, user string) string {
	t.Helper()
	info, err := admin.Do(context.Background(), "ACL", "GETUSER", user).Result()
	if err != nil {
		t.Fatal(err)
	}
	m, ok := info.(map[any]any)
	if !ok {
		if list, isList := info.([]any); isList {
			m = map[any]any{}
			for i := 0; i+1 < len(list); i += 2 {
				m[list[i]] = list[i+1]
			}
		}
	}
	return fmt.Sprint(m["commands"], " | ", m["keys"], " | ", m["channels"])
}

// TestHelmTrust: the chart with every trust option (ci/trust-values.yaml)
// lints, gives the manager and the enforcers their ACL users, the TLS files
// of the Secret and the signing keys, as the binaries' environment
// variables name them, and the API server accepts what it renders.
func TestHelmTrust(t *testing.T) {
	helm := tool(t, "QUOTAPLANE_HELM", "builds Helm (hack/helm.sh)")
	if out, errOut, err := runHelm(t, helm, "lint", "--strict", chartDir(), "--values", filepath.Join(chartDir(), "ci", "trust-values.yaml")); err != nil {
		t.Fatalf("helm lint: %v\n%s%s", err, out, errOut)
	}
	objs := helmTemplate(t, helm, "quota", "trust-values.yaml")
	checkTrusted(t, index(t, objs), "quota", "redis-client-tls", "redis.internal")
	if _, _, err := runHelm(t, helm, "template", "quotaplane", chartDir(), "--set", "redis.tls.enabled=true"); err == nil {
		t.Error("redis.tls.enabled with the trial Redis renders: it should fail (the trial Redis speaks plain text)")
	}

	env := testenv.Start(t)
	ctx := t.Context()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "quota"}}); err != nil {
		t.Fatal(err)
	}
	for _, u := range objs {
		if u.GetKind() == "CustomResourceDefinition" || u.GetKind() == "ServiceMonitor" || u.GetKind() == "PrometheusRule" {
			continue
		}
		if err := env.Client.Create(ctx, u.DeepCopy(), client.DryRunAll, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
			t.Errorf("%s: the API server rejected it: %v", describe(u), err)
		}
	}
}

// checkTrusted: every trust option is on in the Deployments of m in
// namespace: the manager and the enforcers log in as their ACL users with
// their Secret's password, reach Redis over TLS with the CA and a client
// certificate of Secret tlsSecret (the certificate naming serverName; ""
// for the address's host), and the manager signs with the private key of
// a Secret the enforcers do not mount, whose public key they load from a
// ConfigMap.
func checkTrusted(t *testing.T, m manifests, namespace, tlsSecret, serverName string) {
	t.Helper()
	for _, c := range []struct {
		name, user, passwordKey, keyEnv, keyFile, keyVolume string
	}{
		{managerName, "quotaplane-manager", "manager-password", "QUOTAPLANE_POLICY_SIGNING_KEY_FILE", "/etc/quotaplane/policy-signing/signing.pem", "quotaplane-policy-signing"},
		{enforcerName, "quotaplane-enforcer", "enforcer-password", "QUOTAPLANE_POLICY_PUBLIC_KEY_FILE", "/etc/quotaplane/policy-signing/public.pem", "quotaplane-policy-public-key"},
	} {
		d := deployment(t, m, namespace, c.name)
		if got := envValue(t, d, "QUOTAPLANE_REDIS_USERNAME"); got != c.user {
			t.Errorf("%s: QUOTAPLANE_REDIS_USERNAME %q, want %q", c.name, got, c.user)
		}
		if pw := envFrom(t, d, "QUOTAPLANE_REDIS_PASSWORD"); pw == nil || pw.SecretKeyRef == nil || pw.SecretKeyRef.Key != c.passwordKey {
			t.Errorf("%s: the Redis password is not the Secret's %s: %+v", c.name, c.passwordKey, pw)
		}
		for env, want := range map[string]string{
			"QUOTAPLANE_REDIS_TLS": "true", "QUOTAPLANE_REDIS_CA_FILE": "/etc/quotaplane/redis-tls/ca.crt",
			"QUOTAPLANE_REDIS_CERT_FILE": "/etc/quotaplane/redis-tls/tls.crt", "QUOTAPLANE_REDIS_KEY_FILE": "/etc/quotaplane/redis-tls/tls.key",
			"QUOTAPLANE_REDIS_TLS_SERVER_NAME": serverName, c.keyEnv: c.keyFile,
		} {
			if got := envValue(t, d, env); got != want {
				t.Errorf("%s: %s = %q, want %q", c.name, env, got, want)
			}
		}
		mounts := map[string]string{}
		for _, vm := range container(t, d).VolumeMounts {
			mounts[vm.MountPath] = vm.Name
		}
		volumes := map[string]corev1.Volume{}
		for _, v := range d.Spec.Template.Spec.Volumes {
			volumes[v.Name] = v
		}
		tlsVolume, signingVolume := volumes[mounts["/etc/quotaplane/redis-tls"]], volumes[mounts["/etc/quotaplane/policy-signing"]]
		if tlsVolume.Secret == nil || tlsVolume.Secret.SecretName != tlsSecret {
			t.Errorf("%s: /etc/quotaplane/redis-tls is not Secret %s: %+v", c.name, tlsSecret, tlsVolume)
		}
		var source string
		var items []corev1.KeyToPath
		switch {
		case signingVolume.Secret != nil:
			source, items = signingVolume.Secret.SecretName, signingVolume.Secret.Items
		case signingVolume.ConfigMap != nil:
			source, items = signingVolume.ConfigMap.Name, signingVolume.ConfigMap.Items
		}
		if source != c.keyVolume || len(items) != 1 || "/etc/quotaplane/policy-signing/"+items[0].Path != c.keyFile {
			t.Errorf("%s: /etc/quotaplane/policy-signing holds %s %+v, want %s as %s", c.name, source, items, c.keyVolume, c.keyFile)
		}
		if c.name == enforcerName && signingVolume.Secret != nil {
			t.Errorf("the enforcers mount a Secret for the public key: they must hold no private key")
		}
	}
}

// TestKustomizeTrust: the kustomize components of config/components, all
// four over config/default (testdata/trusted), build, turn on what the
// chart's trust values turn on (the same checks), and the API server
// accepts what they render.
func TestKustomizeTrust(t *testing.T) {
	kustomize := tool(t, "KUSTOMIZE", "installs kustomize")
	objs := kustomizeBuild(t, kustomize, filepath.Join(testenv.Root(), "config", "components", "testdata", "trusted"))
	namespace := defaultNamespace(t, testenv.Root())
	checkTrusted(t, index(t, objs), namespace, "quotaplane-redis-tls", "")

	env := testenv.Start(t)
	ctx := t.Context()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		t.Fatal(err)
	}
	for _, u := range objs {
		if u.GetKind() == "CustomResourceDefinition" || u.GetKind() == "Namespace" {
			continue
		}
		if err := env.Client.Create(ctx, u.DeepCopy(), client.DryRunAll, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
			t.Errorf("%s: the API server rejected it: %v", describe(u), err)
		}
	}
}
