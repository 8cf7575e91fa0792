// Package environment records what a benchmark ran on: the machine, the
// versions of everything measured, and the PostgreSQL settings that decide
// its speed.
package environment

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Info is the environment of one run.
type Info struct {
	CPU      string
	Cores    int
	MemoryGB float64
	Kernel   string
	Go       string
	// Load is the load average (1, 5, 15 minutes) when read.
	Load string
	// PostgreSQL is the server's version string.
	PostgreSQL string
	// Modules are the versions of the measured libraries.
	Modules []Module
	// Settings are PostgreSQL settings that matter here, in order.
	Settings []Setting
}

// Module is a dependency and its version.
type Module struct{ Path, Version string }

// Setting is a PostgreSQL setting with its unit applied.
type Setting struct{ Name, Value string }

// settingNames are the settings the report lists.
var settingNames = []string{
	"shared_buffers", "effective_cache_size", "work_mem", "synchronous_commit", "fsync",
	"full_page_writes", "wal_level", "wal_buffers", "wal_compression", "max_wal_size",
	"checkpoint_timeout", "commit_delay", "autovacuum", "jit", "max_connections",
}

// modulePaths are the modules whose versions the report lists.
var modulePaths = []string{
	"github.com/riverqueue/river",
	"github.com/riverqueue/river/riverdriver/riverpgxv5",
	"github.com/ThreeDotsLabs/watermill",
	"github.com/ThreeDotsLabs/watermill-sql/v3",
	"github.com/jackc/pgx/v5",
	"gonum.org/v1/plot",
}

// Collect reads the machine and the server at adminURL.
func Collect(ctx context.Context, adminURL string) (Info, error) {
	info := Info{Cores: runtime.NumCPU(), Go: runtime.Version(), Load: LoadAverage()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				info.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "MemTotal:") {
				fmt.Sscanf(strings.TrimPrefix(line, "MemTotal:"), "%d", &kb)
			}
		}
		info.MemoryGB = float64(kb) / (1 << 20)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		info.Kernel = strings.TrimSpace(string(b))
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, want := range modulePaths {
			for _, d := range bi.Deps {
				if d.Path == want {
					info.Modules = append(info.Modules, Module{Path: d.Path, Version: d.Version})
				}
			}
		}
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return info, err
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&info.PostgreSQL); err != nil {
		return info, err
	}
	for _, name := range settingNames {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			return info, err
		}
		info.Settings = append(info.Settings, Setting{Name: name, Value: v})
	}
	return info, nil
}

// LoadAverage is /proc/loadavg's first three fields.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
