package scratch

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/outboxkit/dispatcher/shared/localpg"
)

// ProductionSettings are the settings of the cluster a benchmark starts by
// default, where they differ from PostgreSQL's defaults: what a managed
// PostgreSQL (RDS, Aurora, Cloud SQL) runs with on a small instance.
// Autovacuum stays on and every durability setting at its default, as no
// production server turns them off; shared_buffers is a quarter of a 4 GB
// instance's memory, the managed services' rule.
var ProductionSettings = []string{
	"shared_buffers=1GB",
	"effective_cache_size=3GB",
	"max_wal_size=2GB",
}

// productionMaxConnections is a small managed instance's connection limit.
const productionMaxConnections = 200

// Target is the server a benchmark runs on: by default a throwaway cluster
// of its own with ProductionSettings (shared/localpg), or the server at
// -database-url with -cluster host.
type Target struct {
	url     *string
	cluster *string
}

// TargetFlags defines -cluster and -database-url.
func TargetFlags() *Target {
	return &Target{
		url:     URLFlag(),
		cluster: flag.String("cluster", "local", "local: a throwaway cluster with autovacuum on and a managed server's settings (shared/localpg); host: the server at -database-url"),
	}
}

// Open starts the cluster (or checks the host's server) and returns it with
// a function that stops what Open started.
func (t *Target) Open(ctx context.Context) (*Server, func(), error) {
	switch *t.cluster {
	case "host":
		srv := &Server{AdminURL: *t.url}
		return srv, func() {}, srv.Check(ctx)
	case "local":
		dir, err := os.MkdirTemp("", "outbox-bench-cluster-")
		if err != nil {
			return nil, nil, err
		}
		cluster, err := localpg.Start(ctx, localpg.Options{Dir: dir, Durable: true, MaxConnections: productionMaxConnections, Settings: ProductionSettings})
		if err != nil {
			os.RemoveAll(dir)
			return nil, nil, fmt.Errorf("scratch: start a local cluster (-cluster host runs on -database-url): %w", err)
		}
		stop := func() {
			_ = cluster.Stop(context.Background())
			os.RemoveAll(dir)
		}
		return &Server{AdminURL: cluster.URL}, stop, nil
	default:
		return nil, nil, fmt.Errorf("-cluster %q: want local or host", *t.cluster)
	}
}

// Describe is the line a report prints about the cluster.
func (t *Target) Describe() string {
	if *t.cluster == "host" {
		return "cluster=host (" + redact(*t.url) + ")"
	}
	return "cluster=local (autovacuum on, durable; " + strings.Join(ProductionSettings, ", ") + fmt.Sprintf(", max_connections=%d)", productionMaxConnections)
}

func redact(u string) string {
	if at := strings.LastIndex(u, "@"); at >= 0 {
		if scheme := strings.Index(u, "://"); scheme >= 0 && scheme < at {
			return u[:scheme+3] + "…" + u[at:]
		}
	}
	return u
}
