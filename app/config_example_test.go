package app_test

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/effectively-once/effectively/app"
)

// A service keeps its own settings under service: in the configuration
// file and decodes them over its defaults.
func ExampleConfig_DecodeService() {
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "notifications.yaml")
	err = os.WriteFile(path, []byte(`
defaults:
  attempts: 3
service:
  smtp:
    host: mail.example.com
    port: 2525
`), 0o600)
	if err != nil {
		panic(err)
	}

	type Settings struct {
		SMTP struct {
			Host string `yaml:"host"`
			Port int    `yaml:"port"`
		} `yaml:"smtp"`
		ReminderLead app.Duration `yaml:"reminder_lead"`
	}
	cfg, err := app.LoadConfig(func(key string) (string, bool) {
		if key == app.EnvConfig {
			return path, true
		}
		return "", false
	})
	if err != nil {
		panic(err)
	}
	s := Settings{ReminderLead: app.Duration(time.Hour)} // the defaults
	if err := cfg.DecodeService(&s); err != nil {
		panic(err)
	}
	fmt.Println(s.SMTP.Host, s.SMTP.Port, time.Duration(s.ReminderLead))
	// Output: mail.example.com 2525 1h0m0s
}
